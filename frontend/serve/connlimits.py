"""How many connections serve holds, per client address and in all, and which one gives way for a new one.

A connection is *waiting* while it has not sent a whole request head yet (or, kept alive, the next one):
that is all a slow or idle client (slowloris, a connect-only socket) ever is. When a new connection does
not fit, the one that has been waiting longest gives way, first among the new one's address (at
``per_address``), then among all (at ``total``): a scraper's connection sends its request at once, so a
flood of idle connections, even from the scraper's own address, pushes out only idle connections. A
connection being answered (its request read) never gives way; when none is waiting, the new one is refused.
Not thread-safe: the server's event loop is its only user.
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(eq=False)
class Connection:
    address: str
    close: Callable[[], None]  # drops it (the server's transport.abort)
    held: bool = False  # admitted and not released yet


class ConnectionLimits:
    def __init__(self, per_address: int, total: int) -> None:
        self.per_address = per_address
        self.total = total
        self._count: defaultdict[str, int] = defaultdict(int)
        self._all = 0
        self._waiting: OrderedDict[Connection, None] = OrderedDict()  # longest waiting first
        self._waiting_by_address: defaultdict[str, OrderedDict[Connection, None]] = defaultdict(OrderedDict)
        self.dropped = 0  # waiting connections that gave way to newer ones
        self.refused = 0  # new connections turned away (every held one was being answered)

    def admit(self, new: Connection) -> bool:
        """Hold ``new`` (waiting), closing the connections that give way for it; False (nothing held)
        when it does not fit."""
        if (self._count.get(new.address, 0) >= self.per_address
                and not self._drop_oldest(self._waiting_by_address.get(new.address))):
            return self._refuse(new)
        if self._all >= self.total and not self._drop_oldest(self._waiting):
            return self._refuse(new)
        self._count[new.address] += 1
        self._all += 1
        new.held = True
        self.waiting(new)
        return True

    def waiting(self, conn: Connection) -> None:
        """``conn`` waits for a request head (again, when kept alive): from now on it may give way."""
        if not conn.held:
            return
        self._waiting[conn] = None
        self._waiting_by_address[conn.address][conn] = None

    def answering(self, conn: Connection) -> None:
        """``conn`` sent a whole request head: it keeps its place until :meth:`release`."""
        self._waiting.pop(conn, None)
        by_address = self._waiting_by_address.get(conn.address)
        if by_address is not None:
            by_address.pop(conn, None)
            if not by_address:
                del self._waiting_by_address[conn.address]

    def release(self, conn: Connection) -> None:
        """``conn`` is closed, or gave way (then its server's own release later does nothing)."""
        if not conn.held:
            return
        conn.held = False
        self.answering(conn)
        self._all -= 1
        self._count[conn.address] -= 1
        if not self._count[conn.address]:
            del self._count[conn.address]

    def drop_waiting(self) -> None:
        """Closes every waiting connection (the server is stopping)."""
        while self._drop_oldest(self._waiting):
            pass

    def held(self, address: str | None = None) -> int:
        return self._all if address is None else self._count.get(address, 0)

    def _drop_oldest(self, waiting: OrderedDict[Connection, None] | None) -> bool:
        if not waiting:
            return False
        oldest = next(iter(waiting))
        self.release(oldest)
        self.dropped += 1
        oldest.close()
        return True

    def _refuse(self, new: Connection) -> bool:
        self.refused += 1
        new.close()
        return False
