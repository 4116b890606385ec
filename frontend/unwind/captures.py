"""Processes' mappings captured when their stacks were first copied, and the worker that builds their tables.

A process whose stacks were copied (bpf/stackcopy.c) needs its tables for its copies to be walked, and a
short-lived one (a compiler's assembler lives for milliseconds) is gone by the time the unwind worker, busy
converting another's files, gets to it: its mappings are captured at once (their files held open,
frontend/unwind/processmaps.py) and its tables built from them on CAPTURE_THREADS threads of their own.
A capture that waits is replaced by a newer one (a process's first copies come while the dynamic linker
maps its libraries, each mapping a new epoch); at most MAX_CAPTURES wait.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from optrace.bpf.images import ProcessImage
from optrace.frontend.unwind.processmaps import CapturedMaps

CAPTURE_THREADS = 4  # a process whose files are converted already is not held up by 3 conversions of others'
MAX_CAPTURES = 64  # processes whose mappings are captured (files held open) while they wait for the worker
WAIT_PAUSE_S = 0.01  # how often :meth:`MappingCaptures.wait` looks whether the jobs are done


@dataclass
class Capture:
    """A process's mappings captured for the unwind worker, with its epoch and exec epoch read before them:
    read from /proc (frontend/unwind/processmaps.py), their files held open, or the kernel's image of them
    (bpf/images.py: nothing held, the process may be gone)."""

    epoch: int
    exec_epoch: int
    maps: CapturedMaps | None = None
    image: ProcessImage | None = None

    def close(self) -> None:
        if self.maps is not None:
            self.maps.close()


class MappingCaptures:
    """The captured mappings waiting for the worker, the worker and its jobs. ``take(pid)`` captures a
    process's mappings now (None: gone, or exec'd meanwhile); ``load(pid, capture)`` builds and loads its
    tables from them (on the worker)."""

    def __init__(self, take: Callable[[int], Capture | None], load: Callable[[int, Capture], object],
                 contain: Callable[..., object]) -> None:
        self._take = take
        self._load = load
        self._contain = contain
        self._captures: dict[int, Capture] = {}  # pid -> its newest captured mappings, until the worker takes them
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(CAPTURE_THREADS, thread_name_prefix="optrace-captures")
        self._queued: set[int] = set()
        self._running: Counter[int] = Counter()  # pid -> its capture jobs running

    def capture(self, pid: int, epoch: int) -> bool:
        """Capture the process's mappings now, unless they were at this ``epoch`` already, and queue their
        job; False when nothing was captured (too many wait, or the process is gone: the caller loads its
        tables the usual way)."""
        with self._lock:
            waiting = self._captures.get(pid)
            if waiting is not None and waiting.epoch == epoch:
                return True
            capture = None
            if waiting is not None or len(self._captures) < MAX_CAPTURES:
                capture = self._contain("unwind_tables", self._take, pid)
            if capture is None:
                return False
            self._captures[pid] = capture
            if waiting is not None:
                waiting.close()
            queued = pid in self._queued
            self._queued.add(pid)
        if not queued:
            try:
                self._worker.submit(self._job, pid)
            except RuntimeError:  # shut down: the session is ending (close() closes the capture)
                self._queued.discard(pid)
        return True

    def _job(self, pid: int) -> None:
        with self._lock:
            self._queued.discard(pid)  # first: a capture made from now on queues a job of its own
            capture = self._captures.pop(pid, None)
            if capture is None:  # taken by the job queued before this one
                return
            self._running[pid] += 1
        try:
            self._load(pid, capture)
        finally:
            capture.close()  # (done by the tables' build, unless it failed first)
            with self._lock:
                self._running[pid] -= 1
                if not self._running[pid]:
                    del self._running[pid]

    def pending(self) -> set[int]:
        """The processes whose tables will be built from their captured mappings, or are being built."""
        with self._lock:
            return self._queued | set(self._captures) | set(self._running)

    def wait(self, deadline: float) -> None:
        """Until every job queued so far is done, or the monotonic ``deadline``."""
        while self.pending() and time.monotonic() < deadline:
            time.sleep(WAIT_PAUSE_S)

    def close(self) -> None:
        """Stop the worker (jobs not started are cancelled) and close the captures they would have taken."""
        self._worker.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            captures, self._captures = list(self._captures.values()), {}
        for capture in captures:
            capture.close()
