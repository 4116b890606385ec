"""Turn SIGINT and SIGTERM into a stop request, so a recording ends cleanly and still writes its file."""
from __future__ import annotations

import os
import signal
import threading
from types import FrameType


class StopSignals:
    """While active, SIGINT/SIGTERM set :attr:`stopped` instead of raising, and make :attr:`fd` readable
    (Python's signal wakeup fd), so a ``poll(2)`` that includes it ends at once (a Python handler alone
    would not end it: the call is retried after the handler, PEP 475)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.fd: int | None = None  # while active
        self._previous: dict[int, object] = {}
        self._previous_wakeup: int | None = None
        self._pipe: tuple[int, int] | None = None

    def __enter__(self) -> "StopSignals":
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous_wakeup = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
        self.fd = self._pipe[0]
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            for fd in self._pipe:
                os.close(fd)
            self._pipe, self.fd = None, None

    def clear_wakeups(self) -> None:
        """Empty :attr:`fd` (it also tells of signals other than the stop ones)."""
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:  # empty
            pass

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stopped.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when a stop was requested."""
        return self.stopped.wait(max(seconds, 0.0))
