"""The terminal's keys for `optrace top`: cbreak mode (keys arrive one by one, unechoed; Ctrl-C still
signals), restored on the way out whatever the way out. A thin use of the standard library's termios/tty."""
from __future__ import annotations

import os
import select
import termios
import tty


class Keys:
    """Context manager: the terminal in cbreak mode while inside."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._saved: list | None = None

    def __enter__(self) -> Keys:
        self._saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def read(self, timeout: float) -> str:
        """The keys typed within ``timeout`` seconds ("" when none)."""
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return ""
        data = os.read(self.fd, 64)
        if not data:  # the terminal hung up
            return "q"
        return data.decode("utf-8", "replace")
