"""Whole stacks of several drains in one table, bounded: what a /debug/pprof/profile window and an OTLP
interval keep between drains (the one way serve collects whole stacks over time).

Each drain names its samples over a frame list of its own; the table interns those frames once (a frame
is a value: the same function in two drains is one entry) and counts each (pid, comm, stack) it sees.
At most ``max_stacks`` distinct stacks per count and ``max_frames`` frames: the samples of any further
stack are counted in one ``[stacks over the limit]`` frame, so the totals stay right. Tables that share a
:class:`TableBudget` (the open /debug/pprof/profile windows) hold that many stacks and frames together:
eight full windows took 291 MB, as many windows as clients could open.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from optrace.model import Frame, Sample

OVER_LIMIT = Frame(symbol="[stacks over the limit]", dso="[optrace]")  # a name, not a fallback: resolved

StackKey = tuple[int, str, tuple[int, ...]]  # (pid, comm, frame indices into StackTable.frames, leaf first)


@dataclass
class TableBudget:
    """Distinct stacks and frames that several tables may still add, together."""

    stacks: int
    frames: int


@dataclass
class StackTable:
    max_stacks: int
    max_frames: int
    budget: TableBudget | None = None  # shared with other tables; :meth:`release` gives this one's back
    frames: list[Frame] = field(default_factory=list)
    frame_ids: dict[Frame, int] = field(default_factory=dict)
    stacks: Counter[StackKey] = field(default_factory=Counter)
    _taken: list[int] = field(default_factory=lambda: [0, 0])  # stacks, frames taken from the budget

    def add(self, frames: list[Frame], samples: Iterable[Sample], counts: Counter[StackKey] | None = None) -> None:
        """One drain's samples (indices into ``frames``) into ``counts`` (default: :attr:`stacks`; another
        counter shares this table's frames, e.g. off-CPU time next to CPU samples)."""
        counts = self.stacks if counts is None else counts
        local: dict[int, int] = {}
        for sample in samples:
            key = (sample.pid, sample.comm, self._frames(sample.frames, frames, local))
            if key not in counts and (len(counts) >= self.max_stacks or key[2] is None or not self._take(0)):
                key = (0, "[optrace]", (self._intern(OVER_LIMIT),))
            counts[key] += sample.count

    def release(self) -> None:
        """The table is dropped: what it took from its budget is there for the others again."""
        if self.budget is not None:
            self.budget.stacks += self._taken[0]
            self.budget.frames += self._taken[1]
            self._taken = [0, 0]

    def _take(self, what: int) -> bool:
        """One more stack (0) or frame (1) from the budget, if it has one left."""
        if self.budget is None:
            return True
        left = self.budget.frames if what else self.budget.stacks
        if left <= 0:
            return False
        if what:
            self.budget.frames -= 1
        else:
            self.budget.stacks -= 1
        self._taken[what] += 1
        return True

    def _frames(self, indices: tuple[int, ...], frames: list[Frame], local: dict[int, int]) -> tuple[int, ...] | None:
        """The stack in this table's frames (None past max_frames)."""
        mapped = []
        for index in indices:
            mine = local.get(index)
            if mine is None:
                if frames[index] not in self.frame_ids and (len(self.frames) >= self.max_frames or not self._take(1)):
                    return None
                mine = local[index] = self._intern(frames[index])
            mapped.append(mine)
        return tuple(mapped)

    def _intern(self, frame: Frame) -> int:
        index = self.frame_ids.get(frame)
        if index is None:
            index = self.frame_ids[frame] = len(self.frames)
            self.frames.append(frame)
        return index
