"""What the serve daemon drains: a Source turns what it saw since the previous drain into a Delta
(frontend/serve/sources.py has the CPU profile and the uprobe call counts). A new kind of series is a
Source and the fields of the Delta it fills."""
from __future__ import annotations

from typing import Protocol

from optrace.frontend.serve.totals import Delta


class Source(Protocol):
    event: str | None  # the sampling event once started ("cpu-clock"...), None for non-sampling sources

    def start(self) -> None: ...

    def collect(self, delta: Delta) -> None: ...

    def close(self) -> None: ...
