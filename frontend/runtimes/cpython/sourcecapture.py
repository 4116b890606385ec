"""What `record` keeps for `optrace annotate` of Python functions: the hottest ones' source lines, with the
samples each line had, from the record alone (the file may change, or belong to another machine).

A sample counts for the line of its innermost Python frame (the C code that line called included). Bounded
like machine code (codecapture.CodeBudget): the most sampled functions, each with a minimum share, then the
functions most often in the stacks (whose time is in their callees: annotate counts their lines from the
record's stacks), at most MAX_LINES lines of each. A source file is read only if the process's own user could read it (it is another
user's file: the process names it, root reads it), under optrace.fileaccess's rule (no symlink, no FIFO or
device, bounded size and time); while the process lives, through its root (its mount namespace).
"""
from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence

from optrace.frontend.runtimes.cpython import FRAME_KIND
from optrace.fileaccess import FilePolicy, RefusedFile, open_reader
from optrace.model import Frame, RuntimeSource, Sample
from optrace.procfs import process_uid

MAX_FUNCTIONS = 100  # by their own samples (the innermost Python frame's)
MAX_CALLERS = 200  # more, by the samples whose stacks hold them (a function whose time is in its callees)
MIN_SHARE = 0.005
MAX_LINES = 2000  # of one function, from its first line
MAX_SOURCE_BYTES = 4 << 20
SOURCE_POLICY = FilePolicy(max_size=MAX_SOURCE_BYTES, read_seconds=2.0)

DEFINITIONS = ("def ", "async def ", "class ")
SourceReader = Callable[[int, str], "list[str] | None"]  # (pid, file) -> the file's lines
FunctionKey = tuple[str, str, int, int]  # (qualified name, file, first line, pid)


def capture_sources(frames: Sequence[Frame], samples: Sequence[Sample], read: SourceReader) -> list[RuntimeSource]:
    """The hottest Python functions, with their lines: the MAX_FUNCTIONS with the most own samples (whose
    innermost Python frame is theirs; ``hits`` counts those per line), then the MAX_CALLERS with the most
    samples in their stacks (annotate shows a function's lines by the samples under each, from the record's
    stacks), each with at least MIN_SHARE of the samples."""
    own, anywhere = _function_samples(frames, samples)
    least = MIN_SHARE * sum(sample.count for sample in samples)
    chosen = _hottest({key: sum(lines.values()) for key, lines in own.items()}, MAX_FUNCTIONS, least)
    chosen += _hottest(anywhere, MAX_CALLERS, least, set(chosen))
    kept = []
    texts: dict[tuple[int, str], list[str] | None] = {}
    for key in chosen:
        symbol, file, first, pid = key
        text = texts.get((pid, file))
        if (pid, file) not in texts:
            text = texts[pid, file] = read(pid, file)
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
