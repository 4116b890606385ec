"""What `record` keeps for `optrace annotate` of Python functions: the hottest ones' source lines, with the
samples each line had, from the record alone (the file may change, or belong to another machine).

A sample counts for the line of its innermost Python frame (the C code that line called included). Bounded
like machine code (codecapture.CodeBudget): the most sampled functions, each with a minimum share, at most
MAX_LINES lines of each.

A code object's file name and first line are the process's to choose (``code.replace(co_filename=...)``), so
a source file is read only if the process's user could open it: opened with that user's credentials
(optrace.credentials.run_as: uid, gid, groups and its file-access capabilities), the kernel checking every
folder on the way, under optrace.fileaccess's rule (no symlink, no mount crossed, no FIFO or device, bounded
size and time). While the process lives, through its own root (its mount namespace) with its credentials of
now; once it is gone, with those it had when it was first looked at, and only if its root and mount
namespace were optrace's own. The files of one process are read in one batch (one thread).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from optrace.credentials import Credentials, process_credentials, run_as
from optrace.fileaccess import FilePolicy, RefusedFile, open_reader
from optrace.jitmaps.procinfo import read_identity
from optrace.model import Frame, PythonSource, Sample

MAX_FUNCTIONS = 100
MIN_SHARE = 0.005
MAX_LINES = 2000  # of one function, from its first line
MAX_SOURCE_BYTES = 4 << 20
SOURCE_POLICY = FilePolicy(max_size=MAX_SOURCE_BYTES, read_seconds=2.0)

DEFINITIONS = ("def ", "async def ", "class ")
# (pid, files) -> the lines of those that could be read
SourceReader = Callable[[int, Sequence[str]], "dict[str, list[str]]"]


@dataclass(frozen=True)
class SourceOwner:
    """For whom a Python process's source files are read, as first seen: its credentials, its start time
    (a pid used again is another process) and whether its root and mount namespace are optrace's own."""

    credentials: Credentials
    start_ticks: int
    host_mounts: bool


def source_owner(pid: int) -> SourceOwner | None:
    """The process's :class:`SourceOwner` now; None when it is gone."""
    identity, credentials = read_identity(pid), process_credentials(pid)
    if identity is None or credentials is None:
        return None
    return SourceOwner(credentials, identity.start_ticks, identity.host_mounts)


def capture_sources(frames: Sequence[Frame], samples: Sequence[Sample], read: SourceReader) -> list[PythonSource]:
    """The hottest Python functions (by samples whose innermost Python frame is theirs), with their lines."""
    hits: dict[tuple[str, str, int, int], Counter[int]] = {}
    for sample in samples:
        frame = next((frames[i] for i in sample.frames if frames[i].python and frames[i].resolved), None)
        if frame is not None:
            key = (frame.symbol, frame.dso, frame.address, sample.pid)
            hits.setdefault(key, Counter())[frame.line] += sample.count
    least = MIN_SHARE * sum(sample.count for sample in samples)
    hottest = [(key, lines) for key, lines in sorted(hits.items(), key=lambda item: -sum(item[1].values()))
               [:MAX_FUNCTIONS] if sum(lines.values()) >= least]
    texts = _read_by_process(((pid, file) for (_, file, _, pid), _ in hottest), read)
    kept = []
    for (symbol, file, first, pid), lines in hottest:
        text = texts.get((pid, file))
        if text is None or not 0 < first <= len(text):
            continue
        last = min(function_end(text, first), first + MAX_LINES - 1)
        kept.append(PythonSource(symbol, file, first, text[first - 1:last],
                                 {line: n for line, n in lines.items() if first <= line <= last}, pid,
                                 truncated=max(lines) > last))
    return kept


def _read_by_process(wanted: Iterable[tuple[int, str]], read: SourceReader) -> dict[tuple[int, str], list[str]]:
    """Each process's files, one ``read`` a process."""
    by_pid: dict[int, list[str]] = {}
    for pid, file in wanted:
        if file not in by_pid.setdefault(pid, []):
            by_pid[pid].append(file)
    return {(pid, file): text for pid, files in by_pid.items() for file, text in read(pid, files).items()}


def function_end(text: Sequence[str], first: int) -> int:
    """The last line of the function whose first line (its decorators, then ``def``) is ``first``: its body
    is what follows, indented deeper than the ``def`` (blank lines, comments and a multi-line signature's
    closing parenthesis aside)."""
    indent = _indent(text[first - 1])
    number = next((n for n in range(first, min(len(text), first + MAX_LINES) + 1)
                   if _indent(text[n - 1]) == indent and text[n - 1].lstrip().startswith(DEFINITIONS)), first)
    last = number  # the def line
    for number in range(number + 1, len(text) + 1):
        stripped = text[number - 1].strip()
        if stripped and not stripped.startswith(("#", ")")) and _indent(text[number - 1]) <= indent:
            break
        if stripped:
            last = number
    return last


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def read_sources(pid: int, files: Sequence[str], owner: SourceOwner) -> dict[str, list[str]]:
    """The lines of those of a process's source ``files`` its user can open (see the module's docstring);
    ``owner``: the process as first seen."""
    files = [file for file in files if os.path.isabs(file)]
    root = _process_root(pid)  # before the look: a pid used again after it is not the process looked at
    now = source_owner(pid) if root is not None else None
    if now is None or now.start_ticks != owner.start_ticks:
        if root is not None:
            os.close(root)
        now, root = None, None
        if not owner.host_mounts:
            return {}  # gone, and its paths were another mount namespace's
    user = owner.credentials if now is None else now.credentials
    try:
        found = run_as(user, lambda: {file: _lines(file, root) for file in files},
                       SOURCE_POLICY.read_seconds * len(files) + 1.0)
    except TimeoutError:
        return {}  # the thread still reads through ``root``: left open
    except OSError:  # the credentials could not be taken
        found = {}
    if root is not None:
        os.close(root)
    return {file: lines for file, lines in found.items() if lines is not None}


def _process_root(pid: int) -> int | None:
    try:
        return os.open(f"/proc/{pid}/root", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None


def _lines(file: str, root: int | None) -> list[str] | None:
    """The file's lines, opened (by the calling thread, holding the user's credentials) inside ``root``
    (None: optrace's own root)."""
    try:
        reader = open_reader(file, SOURCE_POLICY, root_fd=root, shown=file)
        if reader is None:
            return None
        with reader:
            return reader.read().decode("utf-8", "replace").splitlines()
    except (RefusedFile, OSError):
        return None
