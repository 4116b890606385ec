"""`GET /debug/pprof/profile?seconds=N` of `optrace serve`: the stacks of the next N seconds, as pprof.

Go's net/http/pprof URL and parameter, so `go tool pprof http://HOST:PORT/debug/pprof/profile` and the
pull scrapers of Parca and Pyroscope collect from optrace as from a Go service. serve drains the kernel
every period; while a collection (a *window*) is open, the daemon asks its profile source for whole
stacks (otherwise it names only leaves) and hands each drain's stacks to every open window. A window
closes at the first drain at or after its end; its request then gets the samples of the drains since it
opened (the first drain may hold up to one period from before the request).

Bounded: N is 1..MAX_SECONDS; one collection at a time per client address and MAX_WINDOWS in all
(more: 429); the open windows keep at most MAX_WINDOW_STACKS distinct stacks and MAX_WINDOW_FRAMES frames
together (one window alone may take all of it), and count the samples of any further stack in one
``[stacks over the limit]`` frame, so the total stays right (frontend/serve/stacktable.py, which OTLP's
intervals share): eight windows of a machine whose every sample was a new stack took 291 MB when each had
that bound of its own, 36 MB now.
"""
from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from optrace import __version__
from optrace.exporters.pprof import encode
from optrace.frontend.serve.stacktable import StackKey, StackTable, TableBudget
from optrace.model import Frame, Record, RecordMeta, Sample

MAX_SECONDS = 300
DEFAULT_SECONDS = 30  # Go's default
MAX_WINDOWS = 8
MAX_WINDOW_STACKS = 100_000
MAX_WINDOW_FRAMES = 200_000
WAIT_SLACK_S = 30.0  # a window whose drain never comes (a stalled loop) is answered this long after its end


class WindowRefused(Exception):
    """A collection that cannot start: ``status`` is the HTTP status line, the message its one-line body."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_seconds(values: list[str]) -> int:
    """The ``seconds`` parameter (the first, as Go's FormValue; Go's default when absent); WindowRefused
    (400) unless a whole number 1..MAX_SECONDS."""
    if not values:
        return DEFAULT_SECONDS
    text = values[0].strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_SECONDS:
        shown = text[:20].encode("ascii", "backslashreplace").decode()
        raise WindowRefused("400 Bad Request", f"bad seconds={shown!r}: a whole number from 1 to {MAX_SECONDS}")
    return int(text)


@dataclass
class _Window:
    client: str
    opened_wall: float
    opened: float  # monotonic
    ends: float  # monotonic
    table: StackTable = field(default_factory=lambda: StackTable(MAX_WINDOW_STACKS, MAX_WINDOW_FRAMES))
    closed_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def frames(self) -> list[Frame]:
        return self.table.frames

    @property
    def stacks(self) -> Counter[StackKey]:
        return self.table.stacks

    def add(self, frames: list[Frame], samples: list[Sample]) -> None:
        self.table.add(frames, samples)


class ProfileWindows:
    """The open collections; :meth:`drained` is called by the drain loop, :meth:`collect` by requests."""

    def __init__(self, frequency_hz: int, event: Callable[[], str]) -> None:
        self._frequency_hz = frequency_hz
        self._event = event
        self._lock = threading.Lock()
        self._open: list[_Window] = []
        self._budget = TableBudget(MAX_WINDOW_STACKS, MAX_WINDOW_FRAMES)  # the open windows' together
        self._stopping = False

    def active(self) -> bool:
        return bool(self._open)

    def drained(self, stacks: tuple[list[Frame], list[Sample]] | None, now: float) -> None:
        """One drain's stacks to every open window; windows whose end has come are closed. Under the lock:
        a request takes its window out under it before reading it."""
        with self._lock:
            for window in self._open:
                if window.done.is_set():
                    continue
                if stacks is not None:
                    window.add(*stacks)
                if now >= window.ends:
                    window.closed_at = now
                    window.done.set()

    def stop(self) -> None:
        """serve is stopping: waiting requests are answered at once (503)."""
        self._stopping = True
        with self._lock:
            for window in self._open:
                window.done.set()

    def collect(self, client: str, seconds: int) -> bytes:
        """Block for ``seconds`` (one window), then return its gzipped pprof. Raises WindowRefused."""
        window = self._open_window(client, seconds)
        try:
            window.done.wait(seconds + WAIT_SLACK_S)
        finally:
            with self._lock:
                self._open.remove(window)
                window.table.release()
        if self._stopping:
            raise WindowRefused("503 Service Unavailable", "optrace serve is stopping")
        return encode(self._record(window), empty_ok=True)

    def refusal(self, client: str) -> WindowRefused | None:
        """Why a window for ``client`` would be refused now (None: it would open). Never waits: the lock is
        only tried (the server's event loop asks, for a flood of requests to be answered at once)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._refusal(client)
        finally:
            self._lock.release()

    def _refusal(self, client: str) -> WindowRefused | None:
        if self._stopping:
            return WindowRefused("503 Service Unavailable", "optrace serve is stopping")
        if any(window.client == client for window in self._open):
            return WindowRefused("429 Too Many Requests",
                                 "a profile for this client is already being collected: one at a time")
        if len(self._open) >= MAX_WINDOWS:
            return WindowRefused("429 Too Many Requests",
                                 f"{MAX_WINDOWS} profiles are already being collected: try again later")
        return None

    def _open_window(self, client: str, seconds: int) -> _Window:
        with self._lock:
            refused = self._refusal(client)
            if refused is not None:
                raise refused
            now = time.monotonic()
            window = _Window(client, time.time(), now, now + seconds,
                             StackTable(MAX_WINDOW_STACKS, MAX_WINDOW_FRAMES, self._budget))  # the bound, shared
            self._open.append(window)
            return window

    def _record(self, window: _Window) -> Record:
        uname = os.uname()
        ended = window.closed_at if window.closed_at is not None else time.monotonic()
        samples = [Sample(pid, comm, frames, count) for (pid, comm, frames), count in window.stacks.items()]
        meta = RecordMeta(optrace_version=__version__, hostname=uname.nodename, kernel=uname.release,
                          started=window.opened_wall, duration_s=max(ended - window.opened, 0.0),
                          frequency_hz=self._frequency_hz, event=self._event() or "cpu-clock",
                          system_wide=True, total_samples=sum(window.stacks.values()))
        return Record(meta, window.frames, samples)
