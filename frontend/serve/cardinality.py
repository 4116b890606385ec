"""The cardinality guard: at most ``max_series`` series per metric, whatever the machine runs.

A label set that already has a series always keeps it (a counter never jumps from one series to
another). A new label set gets its own series while the metric has room; when it does not, the
sample degrades in two steps, so the series count never exceeds ``max_series``:

1. the *coarse* label (``symbol`` for CPU samples, ``comm`` for uprobe calls) becomes ``[other]``,
   keeping the rest (``{comm="java", dso="[jit]", symbol="[other]"}``): a budget of
   ``overflow_slots(max_series)`` series is kept back for these;
2. when that budget is used up too, every label becomes ``[other]``: one last slot is kept back
   for this catch-all series.
"""
from __future__ import annotations

from dataclasses import dataclass

from optrace.fileaccess import printable

OTHER = "[other]"
MIN_SERIES = 3  # one regular series, one coarse [other] series, the catch-all
MAX_LABEL_CHARS = 256  # longer label values are cut to this many characters, CUT_MARK included
CUT_MARK = "\u2026"  # "…" ends a value that was cut

Labels = tuple[str, ...]


def bound_label(value: str) -> str:
    """A label value as the page shows it: control characters (and undecodable bytes, which
    os.fsdecode leaves as lone surrogates) become "?", and a value longer than MAX_LABEL_CHARS is
    cut, ending with CUT_MARK. Names come from files any user writes (perf maps, binaries): this
    keeps one name from costing more than a few hundred bytes per series, on the page and in memory."""
    if len(value) > MAX_LABEL_CHARS:
        value = value[: MAX_LABEL_CHARS - len(CUT_MARK)] + CUT_MARK
    return value if value.isprintable() else printable(value)


def bound_labels(labels: Labels) -> Labels:
    return tuple(bound_label(value) for value in labels)


def overflow_slots(max_series: int) -> int:
    """Series kept back for step 1 and step 2 (5%, at least two)."""
    return max(2, max_series // 20)


@dataclass(frozen=True)
class Admission:
    labels: Labels  # the series the sample is counted in
    overflow: bool  # True when that is an [other] series standing in for ``requested``


class SeriesGuard:
    """Decides which series a label set is counted in. Not thread-safe: the owner locks."""

    def __init__(self, max_series: int, coarse_index: int, label_count: int) -> None:
        if max_series < MIN_SERIES:
            raise ValueError(f"max_series must be at least {MIN_SERIES}")
        self.max_series = max_series
        self._coarse_index = coarse_index
        self._catch_all: Labels = (OTHER,) * label_count
        self._regular_limit = max_series - overflow_slots(max_series)

    def admit(self, labels: Labels, existing: set[Labels] | dict[Labels, object]) -> Admission:
        """The series for ``labels`` given the series that already exist (a set or dict of them)."""
        if labels in existing:
            return Admission(labels, overflow=False)
        if len(existing) < self._regular_limit:
            return Admission(labels, overflow=False)
        coarse = labels[: self._coarse_index] + (OTHER,) + labels[self._coarse_index + 1:]
        if coarse in existing or len(existing) < self.max_series - 1:
            return Admission(coarse, overflow=True)
        return Admission(self._catch_all, overflow=True)
