"""The bounded queue between serve's drain loop and its OTLP sender.

The drain loop puts each interval's encoded request here and never waits; the sender takes the oldest,
sends it, retries it, and removes it once it is done. The queue holds at most ``max_bytes`` of requests,
the one being sent included: a request that would pass the bound drops the oldest ones first (a backend
that is down or slow costs the oldest profiles, never memory, never a drain). The default bound, 16 MiB,
holds a few minutes of a busy host's profiles (bench/README.md: a 5 s interval of 1,000 distinct stacks
is about 0.1 MB), longer than the sender keeps retrying one request (frontend/serve/otlpexport.py).
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field


@dataclass(eq=False)
class QueuedRequest:
    """One interval's request: its bytes and what it holds (for the self-metrics)."""

    body: bytes
    samples: int  # CPU samples in it
    created: float  # monotonic: the sender gives up retrying it some time after
    attempts: int = 0
    dropped: bool = False  # the queue dropped it (perhaps while it was being sent)

    @property
    def size(self) -> int:
        return len(self.body)


@dataclass
class RequestQueue:
    max_bytes: int
    _items: deque[QueuedRequest] = field(default_factory=deque)
    _bytes: int = 0
    _closed: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def put(self, request: QueuedRequest) -> list[QueuedRequest]:
        """Add ``request`` (never blocks); the requests dropped to keep the bound, oldest first (the new one
        itself when it alone is over the bound)."""
        with self._changed:
            if request.size > self.max_bytes:
                return [request]
            dropped = []
            while self._bytes + request.size > self.max_bytes:
                oldest = self._items.popleft()
                self._bytes -= oldest.size
                oldest.dropped = True
                dropped.append(oldest)
            self._items.append(request)
            self._bytes += request.size
            self._changed.notify_all()
            return dropped

    def head(self, timeout: float | None = None) -> QueuedRequest | None:
        """The oldest request (left in the queue until :meth:`done`), waiting for one up to ``timeout``;
        None when there is none by then or the queue is closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._items or self._closed, timeout)
            return self._items[0] if self._items and not self._closed else None

    def done(self, request: QueuedRequest) -> bool:
        """The sender is done with ``request``: out of the queue. False when the queue had dropped it."""
        with self._changed:
            if request.dropped:
                return False
            self._items.remove(request)
            self._bytes -= request.size
            self._changed.notify_all()
            return True

    def wait_empty(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: not self._items, timeout)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
