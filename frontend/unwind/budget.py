"""How much per-process work a session does per second, whatever the machine's churn: a process's tables built
(its image read, or its maps), its maps read for the symbolizer or for Python, are each one look, and at most
LOOKS_PER_SECOND of them are taken per second (a token bucket holding up to BURST_SECONDS of them).

A look refused is counted (:attr:`ProcessBudget.deferred`, by kind) and not lost where it can wait: a process
whose copies want its tables asks again at every drain while they wait (frontend/unwind/copies.py), and its
image (bpf/images.py) outlives it; a symbolizer's look that is refused leaves its frames to be named by
build-id from the files indexed (the exec'd program and its libraries).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

LOOKS_PER_SECOND = 200.0  # a 2-CPU machine under an exec storm sampled ~85 new processes a second at 999 Hz
BURST_SECONDS = 2.0


class ProcessBudget:
    """A token bucket of looks; thread-safe (the copy watcher, the workers and the drain take from it)."""

    def __init__(self, per_second: float = LOOKS_PER_SECOND, burst_seconds: float = BURST_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self._capacity = per_second * burst_seconds
        self._tokens = self._capacity
        self._clock = clock
        self._at = clock()
        self._lock = threading.Lock()
        self.taken: Counter[str] = Counter()
        self.deferred: Counter[str] = Counter()

    def take(self, kind: str) -> bool:
        """Whether one look of ``kind`` may be done now (counted either way)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._capacity, self._tokens + (now - self._at) * self.per_second)
            self._at = now
            if self._tokens < 1:
                self.deferred[kind] += 1
                return False
            self._tokens -= 1
            self.taken[kind] += 1
            return True
