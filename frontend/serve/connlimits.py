"""How many connections serve holds, per client address and in all, what their answers may hold in memory,
and which connection gives way for a new one.

Every connection stands in a line ordered by its last *progress*: when it was accepted, when it sent a
whole request head, when its answer was built, and whenever the kernel took bytes of its answer. Bytes of
an unfinished head are not progress (a slowloris trickle is not). While its answer is being built the
connection steps out of the line: the server's slowness is not the client's (a scraper's connection
waiting for a page render under a flood of connections that each got twenty 401s went first). When a new
connection does not fit, the first in line gives way, whatever its state (waiting for a request, or
blocked because its client does not read): first among the new one's address (at ``per_address``), then
among all (at ``total``); only when none is in line does the one whose answer has been building longest.
A scraper's connection progresses within milliseconds of its accept, so a flood, even from the scraper's
own address, pushes out only connections that sit still. A new connection is always let in. A connection
waiting for its client's turn to be refused (refusals.py: a flood of requests without valid credentials)
goes to the front of the line: it gives way before any other.

Request bytes read but not answered yet (a head being sent, requests pipelined behind it) stay within
``request_bytes`` in all: past it, the connections holding such bytes give way in the same order (a
scraper's head is whole within a millisecond of its first byte, a slowloris's 8 KiB never are).

Answers are written from their own bytes, never copied per connection: a page that 4,000 connections
are writing is held once. The bodies being written, each counted once however many connections write
it, stay within ``answer_bytes``: an answer that would pass it makes the writing connections with the
oldest progress give way first (a slow reader of each of many distinct bodies, pprof profiles or pages of
past drains, cannot pin them all). The answer that starts is always let through.

Not thread-safe: the server's event loop is its only user.
"""
from __future__ import annotations

import math
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(eq=False)
class Connection:
    address: str
    close: Callable[[], None]  # cuts it (the server cancels its conversation, which resets the socket)
    held: bool = False  # admitted and not released yet
    answering: bool = False  # a request head came: its answer is being built or written
    body: bytes | None = None  # the answer body it is writing (counted in ConnectionLimits.answer_held)
    buffered: int = 0  # request bytes read and not answered yet (counted in ConnectionLimits.request_held)
    due: float = math.inf  # cut at this time (the server's loop clock) by :meth:`ConnectionLimits.cut_overdue`


class ConnectionLimits:
    def __init__(self, per_address: int, total: int, request_bytes: int, answer_bytes: int) -> None:
        self.per_address = per_address
        self.total = total  # may change (a reload that turns TLS on or off): the next admissions keep to it
        self.request_bytes = request_bytes
        self.answer_bytes = answer_bytes
        self._held = 0
        self._count: Counter[str] = Counter()  # held, by address
        self._all: OrderedDict[Connection, None] = OrderedDict()  # the line: oldest progress first
        self._by_address: defaultdict[str, OrderedDict[Connection, None]] = defaultdict(OrderedDict)
        self._building: OrderedDict[Connection, None] = OrderedDict()  # out of the line, longest first
        self._reading: OrderedDict[Connection, None] = OrderedDict()  # those holding request bytes, likewise
        self._writing: OrderedDict[Connection, None] = OrderedDict()  # those writing a body, likewise
        self._bodies: dict[int, list] = {}  # id(body) -> [body, connections writing it]
        self.request_held = 0  # request bytes read and not answered yet
        self.answer_held = 0  # bytes of the distinct bodies being written
        self.cut = 0  # connections that gave way to newer ones or to an answer
        self.timed_out = 0  # connections cut at their deadline
        self.peak = 0  # the most held at once since :meth:`reset_peak`

    def admit(self, new: Connection) -> None:
        """Hold ``new``, cutting the connections that give way for it."""
        if self._count[new.address] >= self.per_address:
            self._cut(self._first(new.address))
        while self._held >= max(self.total, 1):
            self._cut(self._first(None))
        new.held = True
        self._held += 1
        self._count[new.address] += 1
        self._line_up(new)
        self.peak = max(self.peak, self._held)

    def progressed(self, conn: Connection) -> None:
        """``conn`` made progress: it moves to the end of the line of those that give way."""
        if conn not in self._all:
            return
        self._all.move_to_end(conn)
        self._by_address[conn.address].move_to_end(conn)
        for line in (self._reading, self._writing):
            if conn in line:
                line.move_to_end(conn)

    def demote(self, conn: Connection) -> None:
        """``conn`` waits for its client's turn to be refused (refusals.py): it gives way first, before
        any connection that made no progress, until it makes some."""
        if conn not in self._all:
            return
        self._all.move_to_end(conn, last=False)
        self._by_address[conn.address].move_to_end(conn, last=False)

    def building(self, conn: Connection) -> None:
        """``conn``'s answer is being built: out of the line until :meth:`built`."""
        if conn in self._all:
            self._out_of_line(conn)
            self._building[conn] = None

    def built(self, conn: Connection) -> None:
        """``conn``'s answer is ready (progress): back in the line, at its end."""
        if conn in self._building:
            del self._building[conn]
            self._line_up(conn)

    def reading(self, conn: Connection, buffered: int) -> None:
        """``conn`` holds ``buffered`` request bytes now; those holding others give way while the bytes
        held pass ``request_bytes``."""
        if not conn.held:
            return
        if not buffered:
            self._unread(conn)
            return
        self.request_held += buffered - conn.buffered
        conn.buffered = buffered
        self._reading.setdefault(conn, None)
        while self.request_held > self.request_bytes and (other := _first_but(self._reading, conn)) is not None:
            self._cut(other)

    def writing(self, conn: Connection, body: bytes) -> None:
        """``conn`` starts writing ``body``; the writers of other bodies give way while those bodies pass
        ``answer_bytes``."""
        if not conn.held:
            return
        self.written(conn)
        entry = self._bodies.get(id(body))
        if entry is None:
            entry = self._bodies[id(body)] = [body, 0]
            self.answer_held += len(body)
        entry[1] += 1
        conn.body = body
        self._writing[conn] = None
        while self.answer_held > self.answer_bytes and (other := _first_but(self._writing, conn, body)) is not None:
            self._cut(other)

    def _unread(self, conn: Connection) -> None:
        self.request_held -= conn.buffered
        conn.buffered = 0
        self._reading.pop(conn, None)

    def written(self, conn: Connection) -> None:
        """``conn`` is done writing its body (or never wrote one)."""
        body, conn.body = conn.body, None
        if body is None:
            return
        self._writing.pop(conn, None)
        entry = self._bodies[id(body)]
        entry[1] -= 1
        if not entry[1]:
            del self._bodies[id(body)]
            self.answer_held -= len(body)

    def release(self, conn: Connection) -> None:
        """``conn`` is closed, or gave way (then its server's own release later does nothing)."""
        if not conn.held:
            return
        conn.held = False
        self.written(conn)
        self._unread(conn)
        if conn in self._building:
            del self._building[conn]
        else:
            self._out_of_line(conn)
        self._held -= 1
        self._count[conn.address] -= 1
        if not self._count[conn.address]:
            del self._count[conn.address]

    def cut_overdue(self, now: float) -> None:
        """Cuts the connections whose deadline (``due``) has passed."""
        overdue = [conn for conn in self._all if conn.due <= now]
        for conn in overdue:
            self.release(conn)
            conn.close()
        self.timed_out += len(overdue)

    def waiting(self) -> list[Connection]:
        """The connections waiting for a request (the server's stop closes those at once)."""
        return [conn for conn in self._all if not conn.answering]

    def held(self, address: str | None = None) -> int:
        return self._held if address is None else self._count.get(address, 0)

    def reset_peak(self) -> int:
        """The peak since the last reset; from now on, the peak is what is held now."""
        peak, self.peak = self.peak, self._held
        return peak

    def _line_up(self, conn: Connection) -> None:
        self._all[conn] = None
        self._by_address[conn.address][conn] = None

    def _out_of_line(self, conn: Connection) -> None:
        del self._all[conn]
        same = self._by_address[conn.address]
        del same[conn]
        if not same:
            del self._by_address[conn.address]

    def _first(self, address: str | None) -> Connection:
        """Who gives way among ``address``'s connections (None: among all): the first in line, else the
        one whose answer has been building longest."""
        line = self._all if address is None else self._by_address.get(address)
        if line:
            return next(iter(line))
        return next(conn for conn in self._building if address is None or conn.address == address)

    def _cut(self, conn: Connection) -> None:
        self.release(conn)
        self.cut += 1
        conn.close()


def _first_but(line: OrderedDict[Connection, None], conn: Connection, body: bytes | None = None) -> Connection | None:
    """The first in ``line`` other than ``conn`` (and than the writers of ``body``)."""
    return next((other for other in line if other is not conn and (body is None or other.body is not body)), None)
