"""`optrace diff BASE NEW`: two records' rows side by side, as `perf diff` compares them.

A row is one value of the sort keys (``-s``, as in report) in either record. Its share in each record
is of that record's samples, so records of different lengths or frequencies compare; the delta is in
percentage points (new minus base). Rows are sorted by the size of the change, largest first.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from optrace.errors import OptraceError
from optrace.frontend.report.callgraph import Node
from optrace.frontend.report.rows import Profile, ReportOptions, Row, RowKey, build_rows, sample_total
from optrace.model import RecordMeta


@dataclass(frozen=True)
class DiffRow:
    key: RowKey
    base_samples: int
    new_samples: int
    base_percent: float
    new_percent: float

    @property
    def delta_percent(self) -> float:
        return round(self.new_percent - self.base_percent, 4)


@dataclass(frozen=True)
class Comparison:
    """What every `diff` format prints: the two profiles and what to say about comparing them."""

    base: Profile
    new: Profile
    notes: tuple[str, ...]


def compare(base: Profile, new: Profile) -> Comparison:
    for profile, which in ((base, "BASE"), (new, "NEW")):
        if sample_total(profile.record) == 0:
            raise OptraceError(f"{which} {profile.source} has no samples: there is nothing to compare")
    return Comparison(base, new, tuple(machine_notes(base.record.meta, new.record.meta)))


def machine_notes(base: RecordMeta, new: RecordMeta) -> list[str]:
    """Records of two machines compare by name (allowed), but their objects may not be the same files."""
    notes = []
    if (base.hostname, base.kernel) != (new.hostname, new.kernel):
        notes.append(f"the records come from different machines ({base.hostname}, kernel {base.kernel};"
                     f" {new.hostname}, kernel {new.kernel}): rows are matched by name, and objects of the"
                     " same name may differ")
    if base.event != new.event:
        notes.append(f"the records sampled different events ({base.event}, {new.event})")
    return notes


def diff_rows(comparison: Comparison, options: ReportOptions) -> list[DiffRow]:
    """Rows of either record, matched by their keys; ``--percent-limit`` keeps a row when its share in
    either record reaches the limit."""
    unlimited = replace(options, percent_limit=0.0)
    base = {row.key: row for row in build_rows(comparison.base.record, unlimited)}
    new = {row.key: row for row in build_rows(comparison.new.record, unlimited)}
    rows = []
    for key in base.keys() | new.keys():
        b, n = base.get(key), new.get(key)
        row = DiffRow(key, _count(b), _count(n), _share(b), _share(n))
        if max(row.base_percent, row.new_percent) >= options.percent_limit:
            rows.append(row)
    rows.sort(key=lambda row: (-abs(row.delta_percent), -row.new_samples, _order(row.key)))
    return rows


def _count(row: Row | None) -> int:
    if row is None:
        return 0
    return row.children if row.children is not None else row.samples


def _share(row: Row | None) -> float:
    if row is None:
        return 0.0
    return row.children_percent if row.children_percent is not None else row.percent


def _order(key: RowKey) -> tuple[str, int, str, str]:
    return (key.comm or "", key.pid or 0, key.dso or "", key.symbol or "")


def base_counts(new_root: Node, base_root: Node) -> dict[int, int]:
    """For a differential flame graph: each node of the NEW tree (by ``id``) -> the samples of the same
    path in the BASE tree (0 where BASE never took it)."""
    counts = {id(new_root): base_root.total}
    pending = [(new_root, base_root)]
    while pending:
        new, base = pending.pop()
        by_name = {(child.symbol, child.dso, child.kind): child for child in base.children.values()}
        for child in new.children.values():
            match = by_name.get((child.symbol, child.dso, child.kind))
            counts[id(child)] = match.total if match else 0
            if match:
                pending.append((child, match))
    return counts
