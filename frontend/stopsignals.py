"""Turn SIGINT and SIGTERM into a stop request, so a recording ends cleanly and still writes its file."""
from __future__ import annotations

import signal
import threading
from types import FrameType


class StopSignals:
    """While active, SIGINT/SIGTERM set :attr:`stopped` instead of raising."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stopped.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when a stop was requested."""
        return self.stopped.wait(max(seconds, 0.0))
