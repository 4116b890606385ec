"""`optrace annotate` of a Python function: its source lines with their share of the samples whose stacks hold the
function (inclusive: a line's time includes the C and Python code it called, so a function whose time is all in
its callees, as a template engine's ``render``, shows which of its lines called them), and each line's own
share (the samples whose innermost Python frame was on it), from the record alone: the lines ``record`` kept
(model.RuntimeSource) and the record's stacks. The record may come from someone else: an entry whose hits fall
outside its kept lines, or that is too large, is skipped with a warning, never trusted."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from optrace.model import RuntimeSource, Record

T = TypeVar("T")
MAX_SOURCE_LINES = 1 << 16  # lines of one function read from a record (record keeps at most 2,000)
MAX_LINE_CHARS = 4096


@dataclass(frozen=True)
class SourceLineShare:
    line: int
    text: str
    samples: int  # whose stacks were on this line of the function (a recursive one's several lines each count)
    percent: float  # of the function's samples
    self_samples: int = 0  # of them, those whose innermost Python frame was this line
    self_percent: float = 0.0


@dataclass
class SourceAnnotation:
    """One Python function (its entries of every selected process merged: same file and first line)."""

    symbol: str
    file: str
    first_line: int
    samples: int  # whose stacks hold the function
    lines: list[SourceLineShare] = field(default_factory=list)
    truncated: bool = False
    pids: tuple[int, ...] = ()
    self_samples: int = 0  # whose innermost Python frame is the function's


@dataclass(frozen=True)
class StackLines:
    """The samples of some processes whose stacks hold one Python function, and those on each of its lines."""

    samples: int
    lines: Counter[int]


def sources_of(record: Record, skipped: dict[str, str]) -> list[RuntimeSource]:
    """The record's kept Python functions that are sound; the others go to ``skipped``."""
    return sound_entries(record.sources, _problem, skipped)


def sound_entries(entries: Iterable[T], problem_of: Callable[[T], str | None], skipped: dict[str, str]) -> list[T]:
    """The entries (of a record's kept code or source) that ``problem_of`` finds nothing wrong with; the others
    go to ``skipped`` by symbol, with their problem."""
    sound = []
    for entry in entries:
        problem = problem_of(entry)
        if problem:
            skipped[entry.symbol] = problem
        else:
            sound.append(entry)
    return sound


def _problem(source: RuntimeSource) -> str | None:
    if len(source.text) > MAX_SOURCE_LINES or any(len(line) > MAX_LINE_CHARS for line in source.text):
        return "more source than any record keeps"
    last = source.first_line + len(source.text)
    if any(not source.first_line <= line < last for line in source.hits):
        return "sample lines outside its source"
    return None


def stack_lines(record: Record, entry: RuntimeSource, pids: Collection[int]) -> StackLines:
    """The samples of ``pids`` whose stacks hold the function of ``entry`` (its name, file and first line), and
    those on each of its lines (a sample counts once per line it holds, once for the function)."""
    function = (entry.symbol, entry.file, entry.first_line)
    lines_of = {i: frame.line for i, frame in enumerate(record.frames)
                if frame.runtime and (frame.symbol, frame.dso, frame.address) == function}
    total, lines = 0, Counter()
    if not lines_of:
        return StackLines(0, lines)
    for sample in record.samples:
        if sample.pid in pids:
            held = {lines_of[i] for i in sample.frames if i in lines_of}
            if held:
                total += sample.count
                lines.update(dict.fromkeys(held, sample.count))
    return StackLines(total, lines)


def annotate_source(entries: list[RuntimeSource], record: Record) -> SourceAnnotation:
    """The lines of the first entry, with the samples of the entries' processes on each: from the record's stacks,
    and every entry's own hits summed (a record without stacks, or older, has the own hits only)."""
    first = entries[0]
    pids = {entry.pid for entry in entries}
    own: Counter[int] = Counter()
    for entry in entries:
        own.update(entry.hits)
    stacks = stack_lines(record, first, pids)
    if stacks.samples < sum(own.values()):  # stacks not kept (record --no-stacks) or not matching: own time only
        stacks = StackLines(sum(own.values()), own)
    lines = [SourceLineShare(number, text, stacks.lines[number], _percent(stacks.lines[number], stacks.samples),
                             own[number], _percent(own[number], stacks.samples))
             for number, text in enumerate(first.text, first.first_line)]
    return SourceAnnotation(first.symbol, first.file, first.first_line, stacks.samples, lines,
                            any(e.truncated for e in entries), tuple(sorted(pids)), sum(own.values()))


def matching_sources(sources: list[RuntimeSource], symbol: str, record: Record) -> list[RuntimeSource]:
    """The entries of the Python function ``symbol`` with the most samples in the record's stacks (one function:
    file and first line; its own samples decide between records without stacks)."""
    groups: dict[tuple[str, int], list[RuntimeSource]] = {}
    for source in sources:
        if source.symbol == symbol:
            groups.setdefault((source.file, source.first_line), []).append(source)

    def weight(group: list[RuntimeSource]) -> tuple[int, int]:
        return (stack_lines(record, group[0], {s.pid for s in group}).samples,
                sum(sum(s.hits.values()) for s in group))
    return max(groups.values(), key=weight) if groups else []


def _percent(count: int, total: int) -> float:
    return round(100.0 * count / total, 4) if total else 0.0
