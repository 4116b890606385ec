"""CPython behind the runtime seam (frontend/runtimes/runtime.py): its part of a session is
:class:`~optrace.frontend.runtimes.cpython.processes.PythonProcesses` with the loaded program's Python maps
(bpf/pythonmaps.py), its counts (outcomes.py) and its source lines (sourcecapture.py)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from optrace.frontend.preflight import CheckResult
from optrace.frontend.runtimes.cpython import FRAME_KIND
from optrace.frontend.runtimes.cpython.outcomes import runtime_counts
from optrace.frontend.runtimes.cpython.processes import PythonOutcome, PythonProcesses
from optrace.frontend.runtimes.cpython.sourcecapture import capture_sources, read_sources
from optrace.frontend.runtimes.runtime import SessionContext
from optrace.model import Frame, RawSample, RuntimeCounts, RuntimeSource, Sample
from optrace.procfs import MapEntry
from optrace.pythonlayout import PYTHON_RUNTIME_ID


class CPythonPart:
    """CPython's part of a session: ``maps`` is the loaded program's PythonMaps."""

    def __init__(self, maps, processes: PythonProcesses) -> None:
        self.maps = maps
        self.processes = processes

    def look_at(self, pid: int, maps: Iterable[MapEntry]) -> None:
        self.processes.look_at(pid, maps)

    def may_run(self, names: Iterable[str]) -> bool:
        return self.processes.may_run_python(names)

    def to_retry(self, now: float) -> list[int]:
        return self.processes.to_retry(now)

    def frame(self, pid: int, word: int) -> Frame:
        return self.processes.frame(pid, word)

    def drained(self) -> None:
        self.processes.add_captures(self.maps.take_captures())

    def exited(self, pid: int) -> None:
        self.maps.forget_process(pid)

    def forget(self, pid: int) -> None:
        self.processes.forget(pid)

    def counts(self, raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample]) -> RuntimeCounts | None:
        outcomes = self.processes.outcomes()
        return runtime_counts(raw, frames, rows, outcomes) if outcomes else None

    def sources(self, frames: Sequence[Frame], rows: Sequence[Sample]) -> list[RuntimeSource]:
        outcomes = self.processes.outcomes()
        return capture_sources(frames, rows, partial(_read_sources_of, outcomes)) if outcomes else []


def _read_sources_of(outcomes: dict[int, PythonOutcome],
                     wanted: Mapping[int, Sequence[str]]) -> dict[tuple[int, str], list[str]]:
    """Python processes' source files, read as their users could."""
    return read_sources(wanted, {pid: outcome.owner for pid, outcome in outcomes.items() if outcome.owner is not None})


@dataclass(frozen=True)
class CPython:
    name: str = FRAME_KIND
    runtime_id: int = PYTHON_RUNTIME_ID

    def start(self, context: SessionContext) -> CPythonPart | None:
        maps = getattr(context.profiler, "python", None)  # bpf/profiler.py: PythonMaps when its walker is loaded
        if maps is None:
            return None
        return CPythonPart(maps, PythonProcesses(maps.load_process, context.symbols))

    def check(self) -> CheckResult:
        from optrace.frontend.runtimes.cpython.survey import check_python  # reads every process: doctor only

        return check_python()


CPYTHON = CPython()
