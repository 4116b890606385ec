"""What `record` keeps for `optrace annotate` of Python functions: the hottest ones' source lines, with the
samples each line had, from the record alone (the file may change, or belong to another machine).

A sample counts for the line of its innermost Python frame (the C code that line called included). Bounded
like machine code (codecapture.CodeBudget): the most sampled functions, each with a minimum share, then the
functions most often in the stacks (whose time is in their callees: annotate counts their lines from the
record's stacks), at most MAX_LINES lines of each.

A code object's file name and first line are the process's to choose (``code.replace(co_filename=...)``), so
a source file is read only if the process's user could open it: opened with that user's credentials
(optrace.credentials.run_as: uid, gid, groups and its file-access capabilities), the kernel checking every
folder on the way, under optrace.fileaccess's rule (no symlink, no mount crossed, no FIFO or device, bounded
size and time). While the process lives, through its own root (its mount namespace) with its credentials of
now; once it is gone, with those it had when it was first looked at, and only if its root and mount
namespace were optrace's own. The files of all processes with the same credentials are read by one
thread (bench/bench_fileaccess.py, 1 file of each of 100 processes of one user: 86 ms at load 22, 169 ms
at load 31; a thread a process 134 and 137 ms: within the noise, and fewer threads).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from optrace.credentials import Credentials, process_credentials, run_as
from optrace.fileaccess import FilePolicy, RefusedFile, open_reader
from optrace.frontend.runtimes.cpython import FRAME_KIND
from optrace.jitmaps.procinfo import read_identity
from optrace.model import Frame, RuntimeSource, Sample

MAX_FUNCTIONS = 100  # by their own samples (the innermost Python frame's)
MAX_CALLERS = 200  # more, by the samples whose stacks hold them (a function whose time is in its callees)
MIN_SHARE = 0.005
MAX_LINES = 2000  # of one function, from its first line
MAX_SOURCE_BYTES = 4 << 20
SOURCE_POLICY = FilePolicy(max_size=MAX_SOURCE_BYTES, read_seconds=2.0)

DEFINITIONS = ("def ", "async def ", "class ")
# files wanted, by pid -> the lines of those that could be read, by (pid, file)
SourceReader = Callable[[Mapping[int, Sequence[str]]], "dict[tuple[int, str], list[str]]"]
FunctionKey = tuple[str, str, int, int]  # (qualified name, file, first line, pid)


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


def capture_sources(frames: Sequence[Frame], samples: Sequence[Sample], read: SourceReader) -> list[RuntimeSource]:
    """The hottest Python functions, with their lines: the MAX_FUNCTIONS with the most own samples (whose
    innermost Python frame is theirs; ``hits`` counts those per line), then the MAX_CALLERS with the most
    samples in their stacks (annotate shows a function's lines by the samples under each, from the record's
    stacks), each with at least MIN_SHARE of the samples."""
    own, anywhere = _function_samples(frames, samples)
    least = MIN_SHARE * sum(sample.count for sample in samples)
    chosen = _hottest({key: sum(lines.values()) for key, lines in own.items()}, MAX_FUNCTIONS, least)
    chosen += _hottest(anywhere, MAX_CALLERS, least, set(chosen))
    wanted: dict[int, list[str]] = {}
    for _, file, _, pid in chosen:
        if file not in wanted.setdefault(pid, []):
            wanted[pid].append(file)
    texts = read(wanted)
    kept = []
    for key in chosen:
        symbol, file, first, pid = key
        text = texts.get((pid, file))
        if text is None or not 0 < first <= len(text):
            continue
        lines = own.get(key, Counter())
        last = min(function_end(text, first), first + MAX_LINES - 1)
        kept.append(RuntimeSource(symbol, file, first, text[first - 1:last],
                                  {line: n for line, n in lines.items() if first <= line <= last}, pid,
                                  truncated=max(lines, default=0) > last))
    return kept


def _function_samples(frames: Sequence[Frame], samples: Sequence[Sample],
                      ) -> tuple[dict[FunctionKey, Counter[int]], Counter[FunctionKey]]:
    """Per function: its own samples by line, and the samples whose stacks hold it (once per sample)."""
    functions = [(frame.symbol, frame.dso, frame.address) if frame.kind == FRAME_KIND and frame.resolved else None
                 for frame in frames]
    own: dict[FunctionKey, Counter[int]] = {}
    anywhere: Counter[FunctionKey] = Counter()
    for sample in samples:
        held = [i for i in sample.frames if functions[i] is not None]
        if not held:
            continue
        own.setdefault((*functions[held[0]], sample.pid), Counter())[frames[held[0]].line] += sample.count
        for function in {functions[i] for i in held}:
            anywhere[(*function, sample.pid)] += sample.count
    return own, anywhere


def _hottest(totals: Mapping[FunctionKey, int], limit: int, least: float,
             taken: Collection[FunctionKey] = ()) -> list[FunctionKey]:
    """Up to ``limit`` keys not in ``taken`` with at least ``least`` samples, most first."""
    ranked = sorted((key for key in totals if key not in taken and totals[key] >= least), key=lambda key: -totals[key])
    return ranked[:limit]


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


def read_sources(wanted: Mapping[int, Sequence[str]], owners: Mapping[int, SourceOwner]) -> dict[tuple[int, str], list[str]]:
    """The lines of those of each process's source files (``wanted``, by pid) its user can open (see the
    module's docstring); ``owners``: the processes as first seen. One thread for each set of credentials."""
    batches: dict[Credentials, list[tuple[int, int | None, list[str]]]] = {}
    roots: list[int] = []
    try:
        for pid, files in wanted.items():
            place = _place(pid, owners.get(pid))
            if place is not None:
                user, root = place
                roots += [root] if root is not None else []
                batches.setdefault(user, []).append((pid, root, [file for file in files if os.path.isabs(file)]))
        texts: dict[tuple[int, str], list[str]] = {}
        for user, batch in batches.items():
            seconds = SOURCE_POLICY.read_seconds * sum(len(files) for _, _, files in batch) + 1.0
            try:
                texts.update(run_as(user, lambda batch=batch: _read_batch(batch), seconds))
            except TimeoutError:  # its thread still reads through these roots: left open
                roots = [root for root in roots if all(root != theirs for _, theirs, _ in batch)]
            except OSError:  # the credentials could not be taken
                continue
        return texts
    finally:
        for root in roots:
            os.close(root)


def _place(pid: int, owner: SourceOwner | None) -> tuple[Credentials, int | None] | None:
    """Whose credentials the process's files are opened with, and in which root (an ``O_PATH`` descriptor,
    the caller's to close; None: optrace's own); None when they are not to be read."""
    if owner is None:
        return None
    root = _process_root(pid)  # before the look: a pid used again after it is not the process looked at
    now = source_owner(pid) if root is not None else None
    if now is not None and now.start_ticks == owner.start_ticks:
        return now.credentials, root
    if root is not None:
        os.close(root)
    return (owner.credentials, None) if owner.host_mounts else None  # gone: its own root, if it was ours


def _process_root(pid: int) -> int | None:
    try:
        return os.open(f"/proc/{pid}/root", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None


def _read_batch(batch: Sequence[tuple[int, int | None, Sequence[str]]]) -> dict[tuple[int, str], list[str]]:
    """Run by a thread holding the processes' credentials."""
    found = {(pid, file): _lines(file, root) for pid, root, files in batch for file in files}
    return {key: lines for key, lines in found.items() if lines is not None}


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
