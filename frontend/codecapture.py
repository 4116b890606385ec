"""What `record` keeps for `optrace annotate`: the hottest functions' machine code and their samples' leaf
offsets, so annotate needs neither root nor the binary (rebuilt, deleted, or JIT code long freed).

Bounded (stated in the README): the :attr:`CodeBudget.functions` functions with the most own samples
(each with at least :attr:`CodeBudget.min_share` of the recording's samples), at most :attr:`CodeBudget.function_bytes` of each one's code and :attr:`CodeBudget.total_bytes` in all.
A function whose code cannot be had (kernel code, an object not found, a JIT function without jitdump
bytes whose process was gone) is left out; annotate lists what was kept. So is an ELF function whose object
file the sampled process's user may not read (a program it may only execute, mode 0711): the record of a
``sudo optrace record`` is the invoking user's, and must give no one code they could not read
(Symbolizer.readable_objects).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optrace.frontend.session import ProfilingSession
from optrace.model import Frame, FunctionCode, Sample, SourceLine

JIT_PREFIX = "[jit] "


@dataclass(frozen=True)
class CodeBudget:
    functions: int = 100
    function_bytes: int = 64 << 10
    total_bytes: int = 2 << 20
    # and only functions with at least this share of the recording's samples: annotating a function
    # sampled once says nothing, and its code would cost more than the rest of a small record
    min_share: float = 0.005


@dataclass(frozen=True)
class Code:
    """Where a function's code starts (as shown, and as the frame's addresses count) and its bytes."""

    shown_start: int  # link-time address (ELF) or the process's address (JIT)
    frame_start: int  # the same point in the frame's address space (file offset for ELF frames)
    code: bytes
    size: int  # the whole function's size


NativeReader = Callable[[Frame, int], "Code | None"]
JitReader = Callable[[int, int, str], "Code | None"]  # pid, address, name
# build-id, link-time [start, end) ranges -> the object's line rows there (.address, .file, .line), by address
LinesReader = Callable[[str, Sequence[tuple[int, int]]], list]


def is_jit(frame: Frame) -> bool:
    return frame.dso.startswith(JIT_PREFIX)


def capture(frames: list[Frame], samples: list[Sample], native: NativeReader, jit: JitReader,
            budget: CodeBudget = CodeBudget(), lines: LinesReader | None = None) -> list[FunctionCode]:
    """The hottest functions' code with their leaf-IP hits, hottest first; with ``lines``, the source lines
    of the ELF functions' code."""
    leaves: Counter[tuple[int, int]] = Counter()  # (frame index, pid) -> samples
    for sample in samples:
        if sample.frames:
            frame = frames[sample.frames[0]]
            if frame.resolved and not frame.kernel:
                leaves[sample.frames[0], sample.pid] += sample.count
    by_function: dict[tuple, list[tuple[int, int, int]]] = {}
    totals: Counter[tuple] = Counter()
    for (index, pid), count in leaves.items():
        frame = frames[index]
        key = (frame.symbol, frame.dso, frame.build_id, pid)
        by_function.setdefault(key, []).append((index, pid, count))
        totals[key] += count
    kept: dict[tuple, FunctionCode] = {}
    read = _ReadOnce(native, jit, budget.function_bytes)
    spent = 0
    least = budget.min_share * sum(sample.count for sample in samples)
    for key, function_samples in totals.most_common(budget.functions):
        if function_samples < least:
            break
        for index, pid, count in by_function[key]:
            frame = frames[index]
            code = read(frame, pid)
            if code is None:
                continue
            entry = kept.get((key, code.shown_start))
            if entry is None:
                if spent + len(code.code) > budget.total_bytes or len(kept) >= budget.functions:
                    continue
                spent += len(code.code)
                entry = kept[key, code.shown_start] = FunctionCode(
                    frame.symbol, frame.dso, code.shown_start, code.code, build_id=frame.build_id, pid=pid,
                    truncated=len(code.code) < code.size)
            offset = frame.address - code.frame_start
            if 0 <= offset < len(entry.code):
                entry.hits[offset] = entry.hits.get(offset, 0) + count
    functions = [entry for entry in kept.values() if entry.hits]
    functions.sort(key=lambda entry: -sum(entry.hits.values()))
    if lines is not None:
        add_source_lines(functions, lines)
    return functions


def add_source_lines(functions: list[FunctionCode], lines: LinesReader) -> None:
    """Each ELF function's source lines, one read of its object's line table for all of them (a big
    library's takes a second or more: once per function, a record of libpython took 30 s to write)."""
    by_object: defaultdict[str, list[FunctionCode]] = defaultdict(list)
    for function in functions:
        if function.build_id is not None and not function.dso.startswith(JIT_PREFIX):
            by_object[function.build_id].append(function)
    for build_id, group in by_object.items():
        rows = lines(build_id, [(f.start, f.start + len(f.code)) for f in group])
        addresses = [row.address for row in rows]
        for function in group:
            first, last = (bisect_left(addresses, a) for a in (function.start, function.start + len(function.code)))
            function.lines = source_lines(rows[first:last], function.start)


class _ReadOnce:
    """Each function's code read once, whatever number of its addresses and processes were sampled."""

    def __init__(self, native: NativeReader, jit: JitReader, max_bytes: int) -> None:
        self._native, self._jit, self._max_bytes = native, jit, max_bytes
        self._read: dict[tuple, list[Code]] = {}

    def __call__(self, frame: Frame, pid: int) -> Code | None:
        key = (frame.symbol, frame.dso, frame.build_id, pid if is_jit(frame) else 0)
        known = self._read.setdefault(key, [])
        for code in known:
            if code.frame_start <= frame.address < code.frame_start + code.size:
                return code
        found = (self._jit(pid, frame.address, frame.symbol) if is_jit(frame)
                 else self._native(frame, self._max_bytes))
        if found is not None:
            known.append(found)
        return found


def source_lines(rows: list, start: int, limit: int = 4096) -> list[SourceLine]:
    """The rows where the source line changes, as offsets from ``start`` (one per address: the last)."""
    by_address = {row.address - start: (row.file, row.line) for row in rows}
    lines, last = [], None
    for offset in sorted(by_address):
        if by_address[offset] != last and len(lines) < limit:
            lines.append(SourceLine(offset, *by_address[offset]))
            last = by_address[offset]
    return lines


def capture_session(session: ProfilingSession, frames: list[Frame], samples: list[Sample],
                    budget: CodeBudget = CodeBudget()) -> list[FunctionCode]:
    """:func:`capture` with the session's objects (ELF code) and JIT code store as the sources."""
    def native(frame: Frame, max_bytes: int) -> Code | None:
        found = session.symbolizer.function_code(frame, max_bytes)
        if found is None:
            return None
        return Code(found.vaddr, found.offset, found.code, found.size)

    def jit(pid: int, address: int, name: str) -> Code | None:
        found = session.jit.code.find(pid, address, name) if session.jit.code is not None else None
        return None if found is None else Code(found.start, found.start, found.code, found.size)

    functions = capture(frames, samples, native, jit, budget, session.symbolizer.source_lines)
    native_objects = {(f.pid, f.build_id) for f in functions if f.build_id is not None and not f.dso.startswith(JIT_PREFIX)}
    readable = session.symbolizer.readable_objects(native_objects)
    return [f for f in functions if (f.pid, f.build_id) not in native_objects or (f.pid, f.build_id) in readable]
