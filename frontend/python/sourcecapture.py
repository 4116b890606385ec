"""What `record` keeps for `optrace annotate` of Python functions: the hottest ones' source lines, with the
samples each line had, from the record alone (the file may change, or belong to another machine).

A sample counts for the line of its innermost Python frame (the C code that line called included). Bounded
like machine code (codecapture.CodeBudget): the most sampled functions, each with a minimum share, at most
MAX_LINES lines of each. A source file is read only if the process's own user could read it (it is another
user's file: the process names it, root reads it), under optrace.fileaccess's rule (no symlink, no FIFO or
device, bounded size and time); while the process lives, through its root (its mount namespace).
"""
from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Sequence

from optrace.fileaccess import FilePolicy, RefusedFile, open_reader
from optrace.model import Frame, PythonSource, Sample
from optrace.procfs import process_uid

MAX_FUNCTIONS = 100
MIN_SHARE = 0.005
MAX_LINES = 2000  # of one function, from its first line
MAX_SOURCE_BYTES = 4 << 20
SOURCE_POLICY = FilePolicy(max_size=MAX_SOURCE_BYTES, read_seconds=2.0)

DEFINITIONS = ("def ", "async def ", "class ")
SourceReader = Callable[[int, str], "list[str] | None"]  # (pid, file) -> the file's lines


def capture_sources(frames: Sequence[Frame], samples: Sequence[Sample], read: SourceReader) -> list[PythonSource]:
    """The hottest Python functions (by samples whose innermost Python frame is theirs), with their lines."""
    hits: dict[tuple[str, str, int, int], Counter[int]] = {}
    for sample in samples:
        frame = next((frames[i] for i in sample.frames if frames[i].python and frames[i].resolved), None)
        if frame is not None:
            key = (frame.symbol, frame.dso, frame.address, sample.pid)
            hits.setdefault(key, Counter())[frame.line] += sample.count
    least = MIN_SHARE * sum(sample.count for sample in samples)
    hottest = sorted(hits.items(), key=lambda item: -sum(item[1].values()))[:MAX_FUNCTIONS]
    kept = []
    texts: dict[tuple[int, str], list[str] | None] = {}
    for (symbol, file, first, pid), lines in hottest:
        if sum(lines.values()) < least:
            break
        text = texts.get((pid, file))
        if (pid, file) not in texts:
            text = texts[pid, file] = read(pid, file)
        if text is None or not 0 < first <= len(text):
            continue
        last = min(function_end(text, first), first + MAX_LINES - 1)
        kept.append(PythonSource(symbol, file, first, text[first - 1:last],
                                 {line: n for line, n in lines.items() if first <= line <= last}, pid,
                                 truncated=max(lines) > last))
    return kept


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


def read_source(pid: int, file: str, uid: int | None = None) -> list[str] | None:
    """The lines of a process's source file, None when it cannot (or may not) be read: inside the process's
    root while it lives, else from ours; only a file the process's user (``uid``, else the process's own)
    may read."""
    uid = process_uid(pid) if uid is None else uid
    if uid is None or not os.path.isabs(file):
        return None
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        root = None
    try:
        reader = open_reader(file, SOURCE_POLICY, root_fd=root, shown=file)
        if reader is None:
            return None
        with reader:
            if not readable_by(os.fstat(reader.fd), uid):
                return None
            return reader.read().decode("utf-8", "replace").splitlines()
    except (RefusedFile, OSError):
        return None
    finally:
        if root is not None:
            os.close(root)


def readable_by(info: os.stat_result, uid: int) -> bool:
    """Whether user ``uid`` (its group memberships left out: a stricter rule) may read a file like this."""
    if uid == 0:
        return True
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IRUSR)
    return bool(info.st_mode & stat.S_IROTH)
