"""The runtimes optrace names frames of, and the session's one handle on them all (:class:`RuntimeParts`).

This is the only module outside a runtime's own folder that names one (tests/test_architecture.py checks it):
the session, the scheduler, the symbolizer and the recorder ask :class:`RuntimeParts`, which asks each started
runtime, and sends a frame word to the runtime whose id it carries.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from optrace.frontend.runtimes.cpython.runtime import CPYTHON
from optrace.frontend.runtimes.runtime import Runtime, RuntimePart, SessionContext
from optrace.frontend.preflight import CheckResult
from optrace.model import UNKNOWN, Frame, RawSample, RuntimeCounts, RuntimeSource, Sample
from optrace.procfs import MapEntry
from optrace.runtimeword import MAX_ID, is_runtime_word, word_runtime

RUNTIMES: tuple[Runtime, ...] = (CPYTHON,)


def doctor_checks() -> list[CheckResult]:
    """What `optrace doctor` says of each runtime (the processes running it now, whether they can be read)."""
    return [result for result in (runtime.check() for runtime in RUNTIMES) if result is not None]


def check_registry(runtimes: Sequence[Runtime]) -> None:
    """Each runtime's id is its own and fits its frame words; each name is its own and no file kind."""
    ids, names = [r.runtime_id for r in runtimes], [r.name for r in runtimes]
    if len(set(ids)) != len(ids) or not all(1 <= i <= MAX_ID for i in ids):
        raise ValueError(f"runtime ids must be distinct, 1..{MAX_ID}: {ids}")
    if len(set(names)) != len(names) or {"native", "kernel", "jit-map"} & set(names):
        raise ValueError(f"runtime names must be distinct and no file kind: {names}")


class RuntimeParts:
    """The started runtimes of a session (those whose walker the loaded program holds), as one."""

    def __init__(self, parts: Iterable[tuple[Runtime, RuntimePart]]) -> None:
        self.parts = list(parts)
        self._by_id = {runtime.runtime_id: part for runtime, part in self.parts}

    @classmethod
    def start(cls, context: SessionContext, runtimes: Sequence[Runtime] | None = None) -> RuntimeParts | None:
        """The parts of ``runtimes`` (:data:`RUNTIMES` when None, read at the call: tests register theirs) that
        start; None when none does (no runtime's walker is loaded)."""
        runtimes = RUNTIMES if runtimes is None else runtimes
        check_registry(runtimes)
        started = [(runtime, runtime.start(context)) for runtime in runtimes]
        parts = [(runtime, part) for runtime, part in started if part is not None]
        return cls(parts) if parts else None

    def look_at(self, pid: int, maps: Iterable[MapEntry]) -> None:
        entries = list(maps)
        for _, part in self.parts:
            part.look_at(pid, entries)

    def may_run(self, names: Iterable[str]) -> bool:
        """Whether any started runtime may run in a process with these mapped files' base names."""
        names = list(names)
        return any(part.may_run(names) for _, part in self.parts)

    def to_retry(self, now: float) -> list[int]:
        return sorted({pid for _, part in self.parts for pid in part.to_retry(now)})

    def frame(self, pid: int, word: int) -> Frame:
        """The frame of a runtime word, named by the runtime whose id it carries."""
        part = self._by_id.get(word_runtime(word)) if is_runtime_word(word) else None
        if part is None:  # a word no started runtime stored: a bad stack record, named as unknown
            return Frame(UNKNOWN, UNKNOWN, address=word, resolved=False)
        return part.frame(pid, word)

    def drained(self) -> None:
        for _, part in self.parts:
            part.drained()

    def exited(self, pid: int) -> None:
        for _, part in self.parts:
            part.exited(pid)

    def forget(self, pid: int) -> None:
        for _, part in self.parts:
            part.forget(pid)

    def counts(self, raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample]
               ) -> dict[str, RuntimeCounts]:
        """RecordMeta.runtimes: each runtime that met a process, by its name."""
        counted = {runtime.name: part.counts(raw, frames, rows) for runtime, part in self.parts}
        return {name: counts for name, counts in counted.items() if counts is not None}

    def sources(self, frames: Sequence[Frame], rows: Sequence[Sample]) -> list[RuntimeSource]:
        return [source for _, part in self.parts for source in part.sources(frames, rows)]
