"""`optrace annotate` of a Python function: its source lines with their share of the function's samples, from
the record alone (model.PythonSource, kept by `record`). The record may come from someone else: an entry
whose hits fall outside its kept lines, or that is too large, is skipped with a warning, never trusted."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from optrace.model import PythonSource, Record

T = TypeVar("T")
MAX_SOURCE_LINES = 1 << 16  # lines of one function read from a record (record keeps at most 2,000)
MAX_LINE_CHARS = 4096


@dataclass(frozen=True)
class SourceLineShare:
    line: int
    text: str
    samples: int
    percent: float  # of the function's samples


@dataclass
class SourceAnnotation:
    """One Python function (its entries of every selected process merged: same file and first line)."""

    symbol: str
    file: str
    first_line: int
    samples: int
    lines: list[SourceLineShare] = field(default_factory=list)
    truncated: bool = False
    pids: tuple[int, ...] = ()


def sources_of(record: Record, skipped: dict[str, str]) -> list[PythonSource]:
    """The record's kept Python functions that are sound; the others go to ``skipped``."""
    return sound_entries(record.python_sources, _problem, skipped)


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


def _problem(source: PythonSource) -> str | None:
    if len(source.text) > MAX_SOURCE_LINES or any(len(line) > MAX_LINE_CHARS for line in source.text):
        return "more source than any record keeps"
    last = source.first_line + len(source.text)
    if any(not source.first_line <= line < last for line in source.hits):
        return "sample lines outside its source"
    return None


def annotate_source(entries: list[PythonSource]) -> SourceAnnotation:
    """The lines of the first entry, with every entry's hits summed on them."""
    first = entries[0]
    hits: dict[int, int] = {}
    for entry in entries:
        for line, count in entry.hits.items():
            hits[line] = hits.get(line, 0) + count
    total = sum(hits.values())
    lines = [SourceLineShare(first.first_line + i, text, hits.get(first.first_line + i, 0),
                             round(100.0 * hits.get(first.first_line + i, 0) / total, 4) if total else 0.0)
             for i, text in enumerate(first.text)]
    return SourceAnnotation(first.symbol, first.file, first.first_line, total, lines,
                            any(e.truncated for e in entries), tuple(sorted({e.pid for e in entries})))


def matching_sources(sources: list[PythonSource], symbol: str) -> list[PythonSource]:
    """The entries of the Python function ``symbol`` with the most samples (one function: file, first line)."""
    groups: dict[tuple[str, int], list[PythonSource]] = {}
    for source in sources:
        if source.symbol == symbol:
            groups.setdefault((source.file, source.first_line), []).append(source)
    return max(groups.values(), key=lambda group: sum(sum(s.hits.values()) for s in group)) if groups else []
