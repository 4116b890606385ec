"""The one interface every runtime implements (docs/runtimes.md), and the word its frames take in a stored stack.

A :class:`Runtime` is what the registry lists: its name (also the kind of its frames, ``Frame.kind``), its id
(in its frame words), how people name it, and how its part of a profiling session starts
(:meth:`Runtime.start`). That part, a :class:`RuntimePart`, is told about processes on the unwind worker
(:meth:`RuntimePart.look_at`: detect by mapped file names, attach: read the runtime's tables and hand the
process's per-process data to its BPF walker, or keep why not), names the frame words its walker stored, takes
what its BPF side sent at each drain, forgets exited processes and counts every outcome. Everything about a
runtime lives in its own folders (frontend/runtimes/<name>/); the session, the scheduler, the symbolizer and
the recorder see this interface only, through the registry (frontend/runtimes/registry.py).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from optrace.frontend.preflight import CheckResult
from optrace.model import Frame, RawSample, RuntimeCounts, RuntimeSource, Sample
from optrace.procfs import MapEntry

class Symbols(Protocol):
    """What a runtime tells the symbolizer (frontend/symbols/symbolizer.py) of its own files: functions their
    symbols may not name, and which files are the runtime's own (their frames fold into its frames)."""

    def add_names(self, build_id: bytes, start: int, end: int, name: str) -> None: ...

    def add_interpreter(self, build_id: bytes | None, file_key: tuple[str, int]) -> None: ...


@dataclass(frozen=True)
class SessionContext:
    """What a runtime's part is started with: the loaded program (bpf/profiler.py's Profiler, whose maps its BPF
    side declared) and the symbolizer it tells about its files."""

    profiler: object
    symbols: Symbols


class RuntimePart(Protocol):
    """One runtime's part of a profiling session. ``look_at`` and ``to_retry`` run on a worker thread while the
    drain names frames: an implementation locks what both touch."""

    def look_at(self, pid: int, maps: Iterable[MapEntry]) -> None:
        """Detect (by mapped file names only) and attach: its BPF walker walks the process from now on (its
        per-process data in the runtime's map), or the reason it does not is kept as the process's outcome."""

    def may_run(self, names: Iterable[str]) -> bool:
        """Whether a process with these mapped files' base names may run this runtime (False: ``look_at``
        would find nothing there, so the scheduler does not read the process's mappings for it)."""

    def to_retry(self, now: float) -> list[int]:
        """Processes refused for a reason that passes, due another look."""

    def frame(self, pid: int, word: int) -> Frame:
        """The frame a frame word of this runtime stands for, in this process's samples."""

    def drained(self) -> None:
        """A drain ran: what the BPF side sent since the last one is taken (what names frames later)."""

    def exited(self, pid: int) -> None:
        """The process exited: its BPF side's entries go (its samples may still be named)."""

    def forget(self, pid: int) -> None:
        """Everything kept about the process goes."""

    def counts(self, raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample]) -> RuntimeCounts | None:
        """The samples of its processes by outcome, its processes by version or why refused (``rows`` are
        ``raw`` symbolized, in order); None when it met no process."""

    def sources(self, frames: Sequence[Frame], rows: Sequence[Sample]) -> list[RuntimeSource]:
        """The hottest functions of its frames with their source lines (`record` keeps them for annotate)."""


class Runtime(Protocol):
    name: str  # "cpython": the kind of its frames (Frame.kind) and OpenTelemetry's profile.frame.type
    runtime_id: int  # in its frame words (1..MAX_ID)

    def start(self, context: SessionContext) -> RuntimePart | None:
        """Its part of a session; None when the loaded program holds no walker of it (turned off)."""

    def check(self) -> CheckResult | None:
        """What `optrace doctor` says of it: the processes running it now and whether they can be read."""

