"""The one interface every runtime implements (docs/runtimes.md), and the session's side of it.

A :class:`Runtime` is what the registry lists: its name, its frame kind, and how to start its part of a
profiling session (:meth:`Runtime.start`) once the BPF program holds its walker. That part, a
:class:`RuntimeSession`, is told about processes on the unwind worker (detect by mapped file names, attach:
read the runtime's tables and hand the process to its BPF walker), names the frame words its walker stored,
takes what its BPF side sent at each drain, forgets exited processes and counts every outcome. Everything
about a runtime lives in its own folders (frontend/runtimes/<name>/, bpf/runtimes/<name>.*); the session,
the scheduler, the symbolizer and the recorder see only this interface, through the registry.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from optrace.model import Frame, RawSample, RuntimeCounts, RuntimeSource, Sample
from optrace.procfs import MapEntry


class RuntimeSymbols(Protocol):
    """What a runtime tells the symbolizer (frontend/symbols/symbolizer.py) of its own files: functions their
    symbols may not name, and which files are the runtime's own (their frames fold into its frames)."""

    def add_names(self, build_id: bytes, start: int, end: int, name: str) -> None: ...

    def add_interpreter(self, build_id: bytes | None, file_key: tuple[str, int]) -> None: ...


@dataclass(frozen=True)
class SessionContext:
    """What a runtime's session part is started with: its BPF side's maps (bpf/runtimes/), the symbolizer
    it tells about its files, and the session's containment (``contain(kind, call, *args)``)."""

    maps: object
    symbols: RuntimeSymbols
    contain: Callable[..., object]


class RuntimeSession(Protocol):
    """One runtime's part of a profiling session. Thread-safe where noted: the unwind worker looks at processes
    while the drain loop names frames."""

    def look_at(self, pid: int, maps: Sequence[MapEntry]) -> None:
        """Detect (by mapped file names only) and attach: the BPF walker walks the process from now on, or the
        reason it does not is kept as the process's outcome (on a worker thread)."""

    def to_retry(self, now: float) -> list[int]:
        """Processes refused for a reason that passes, due another look (on a worker thread)."""

    def frame(self, pid: int, word: int) -> Frame:
        """The frame a frame word of this runtime stands for, in this process's samples."""

    def drained(self, samples: Sequence[RawSample]) -> None:
        """A drain's samples: what the BPF side sent since the last drain is taken (captures to name frames
        by once the process has exited)."""

    def forget(self, pid: int) -> None:
        """Everything about the process goes (its BPF map entries included): it exited or exec'd."""

    def counts(self, raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample]) -> RuntimeCounts:
        """The samples of its processes by outcome, its processes by version or why refused (``rows`` are
        ``raw`` symbolized, in order)."""

    def sources(self, frames: Sequence[Frame], rows: Sequence[Sample]) -> list[RuntimeSource]:
        """The hottest functions of its frames with their source lines (`record` keeps them for annotate)."""


@dataclass(frozen=True)
class BpfPart:
    """A runtime's part of the BPF program (bpf/profiler.py composes it): its C sources (appended after the
    native walker's, in order), the macro that compiles them in, and its maps' class (made on the loaded
    program: ``maps(bpf)``)."""

    sources: tuple[str, ...]
    define: str
    maps: Callable[[object], object]


class Runtime(Protocol):
    name: str  # "cpython": also the kind of its frames (Frame.kind)
    word_tag: int  # its frame words' runtime id (bits 56-61, docs/runtimes.md)

    def bpf_part(self) -> BpfPart:
        """What the BPF program compiles in for this runtime."""

    def start(self, context: SessionContext) -> RuntimeSession:
        """Its part of a session, once the loaded program holds its walker (``context.maps``)."""


def shown_maps(maps: Iterable[MapEntry]) -> list[MapEntry]:
    """The mappings a runtime's detection looks at: executable file mappings (their names only)."""
    return [entry for entry in maps if entry.executable and entry.is_file]
