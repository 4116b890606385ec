"""What a recording's loop sleeps on between drains: a stop signal, the end of a target, and (when asked) the
kernel's process-event buffers. A loop that woke every 50 ms to look for new processes woke 20 times a second
on an idle machine, or beside a -p target that starts nothing; with the buffers in the wait it wakes when a
process starts or ends, and once per drain otherwise."""
from __future__ import annotations

import select
from collections.abc import Sequence

from optrace.frontend.stopsignals import StopSignals
from optrace.frontend.target import ExitWatch


class LoopWait:
    def __init__(self, stop: StopSignals, exits: ExitWatch, event_fds: Sequence[int]) -> None:
        self.stop = stop
        self.exits = exits
        self.event_fds = tuple(event_fds)

    def wait(self, seconds: float, events: bool) -> tuple[int, ...]:
        """Sleep up to ``seconds``, less when a stop signal comes, a watched target exits (no longer watched
        then), or, with ``events``, an event buffer has events: returns those buffers' fds. Polling spends a
        perf buffer's readiness (the kernel clears it), so they are read by fd (Profiler.poll_events)."""
        poller = select.poll()  # not select(): descriptors past 1023 (many -p pids) are fine
        watched = [*self.exits.fds, *(self.event_fds if events else ()),
                   *((self.stop.fd,) if self.stop.fd is not None else ())]
        for fd in watched:
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(max(seconds, 0.0) * 1000)}
        if self.stop.fd in ready:
            self.stop.clear_wakeups()
        self.exits.ended([fd for fd in self.exits.fds if fd in ready])  # a list: ended() removes from fds
        return tuple(fd for fd in self.event_fds if events and fd in ready)
