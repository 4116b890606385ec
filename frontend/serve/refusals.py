"""Refusals (4xx answers: a 401 without valid credentials, a 404, a 429) paced per client, as fail2ban
would, but without a ban: a client's first ``burst`` refusals go at once, then ``rate`` a second; a refusal
past that waits its turn, in its client's queue, while the connection waits in the server's line (first to
give way, connlimits.py) with nothing more read from it.

Why: a refusal costs the server's event loop as much as a page already rendered does (its head parsed, its
answer framed and sent), and a client can ask for them without end, with nothing to find out first. Issue
40's attack with basic auth on (4,652 sockets from 18 addresses, each sending 20 pipelined requests
without a password, opened again when cut) made the loop answer ~5,000 401s a second: it was busy enough
that a scraper's connection waited 0.2-0.4 s for each of its turns (accepted, read, answered), and its page
render on a worker thread, sharing the GIL with it, twice as long: p99 1.25 s. Paced, the same attack is
answered 18 x ``rate`` times a second; a client that sends valid credentials is never paced, whatever
others from its address do.

A client's turn comes at the server's sweep (every 0.25 s: no timer per connection); a connection cut
while it waits leaves its queue without using a turn. Buckets are kept for the last ``clients`` clients
refused (and for those with a refusal waiting, which the connection table bounds): a client forgotten
starts again with a whole burst, which is what it would have after a quiet ``burst / rate`` seconds.

Not thread-safe: the server's event loop is its only user.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass, field


@dataclass
class _Bucket:
    tokens: float
    at: float  # when ``tokens`` was counted
    waiting: deque[asyncio.Future] = field(default_factory=deque)

    def refill(self, now: float, rate: float, burst: float) -> None:
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now


class RefusalPace:
    def __init__(self, rate: float, burst: int, clients: int) -> None:
        self.rate, self.burst, self.clients = rate, float(burst), clients
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()  # least recently refused first
        self._queued: set[str] = set()  # clients with refusals waiting
        self.at_once = 0  # refusals sent at once
        self.waited = 0  # refusals that waited for their turn

    def turn(self, client: str, now: float) -> asyncio.Future | None:
        """None when ``client`` may be refused at once (its turn is taken), else a future of the running
        loop that is done when its turn comes (cancelled, it leaves the queue)."""
        bucket = self._buckets.pop(client, None) or _Bucket(self.burst, now)
        self._buckets[client] = bucket
        self._forget_old()
        bucket.refill(now, self.rate, self.burst)
        if not bucket.waiting and bucket.tokens >= 1:
            bucket.tokens -= 1
            self.at_once += 1
            return None
        waiter = asyncio.get_running_loop().create_future()
        bucket.waiting.append(waiter)
        self._queued.add(client)
        return waiter

    def release(self, now: float) -> None:
        """Lets go the refusals whose turn has come."""
        for client in list(self._queued):
            bucket = self._buckets[client]
            bucket.refill(now, self.rate, self.burst)
            self._let_go(bucket, bucket.tokens)
            if not bucket.waiting:
                self._queued.discard(client)

    def _let_go(self, bucket: _Bucket, turns: float) -> None:
        """Wakes up to ``turns`` of ``bucket``'s waiters (those cut while waiting are skipped, free)."""
        while bucket.waiting and turns >= 1:
            waiter = bucket.waiting.popleft()
            if waiter.done():
                continue
            waiter.set_result(None)
            bucket.tokens -= 1
            turns -= 1
            self.waited += 1

    def _forget_old(self) -> None:
        """Drops the least recently refused client past ``clients`` (one with refusals waiting has them
        let go: a forgotten client has a whole burst)."""
        if len(self._buckets) <= self.clients:
            return
        client, bucket = self._buckets.popitem(last=False)
        self._let_go(bucket, len(bucket.waiting))
        self._queued.discard(client)
