"""Hostile HTTP clients held open against a server on loopback, for a bounded time, from one process.

    python slowclients.py PORT COUNT MODE SOURCES SECONDS [FROM]

MODE ``slowloris``: each connection sends a request line, then one header line every few seconds (never
the blank line that ends the head); ``connect``: each connection only connects and sends nothing;
``pipeline`` (issue 40): each connection shrinks its receive buffer to the least the kernel allows, sends
PIPELINED ``GET /metrics`` requests at once and never reads a byte of the answers.
A connection the server closes is opened again a few seconds later (as slowloris tools do, in their next
round), so about COUNT stay open as long as the server keeps them.
Connections come from SOURCES distinct loopback addresses (127.0.1.2, 127.0.1.3, ...; every 127.x.y.z
answers on Linux's loopback), so per-address limits see many clients (or one: SOURCES 1); with FROM, all
come from that one address (the scraper's own, 127.0.0.1).
Prints ``ready`` once COUNT connections were made, and when SECONDS are over or a line comes on stdin,
one JSON line: connections opened, closed by the server, and the most open at once. Runs in a process
of its own, so that its work does not share the server's GIL.
"""
from __future__ import annotations

import errno
import heapq
import json
import random
import resource
import select
import socket
import sys
import time

HEADER_EVERY_S = (2.0, 4.0)  # each slowloris connection sends a header line this often (random, per line)
REOPEN_AFTER_S = (2.0, 4.0)  # a connection the server closed is opened again this much later
OPEN_PER_TICK = 200  # connections (re)opened per loop pass
PIPELINED = 20
PIPELINE = b"GET /metrics HTTP/1.1\r\nHost: optrace\r\nUser-Agent: slow-reader\r\n\r\n" * PIPELINED
HUNG_UP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


def raise_fd_limit(wanted: int) -> None:
    """Root may raise the hard limit too (the kernel's fs.nr_open caps both); another user up to its hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        with open("/proc/sys/fs/nr_open") as f:
            new = min(wanted, int(f.read()))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, max(hard, new)))
        except (ValueError, PermissionError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(new, hard), hard))


def source_address(index: int, sources: int) -> str:
    n = 1 + index % sources
    return f"127.0.{1 + n // 250}.{1 + n % 250}"


class Clients:
    def __init__(self, port: int, count: int, mode: str, sources: int, origin: str | None = None) -> None:
        self.port, self.count, self.mode, self.sources, self.origin = port, count, mode, sources, origin
        self.epoll = select.epoll()
        self.socks: dict[int, socket.socket] = {}
        self.next_line: dict[int, float] = {}  # when each open connection sends its next line (or its requests)
        self.started: set[int] = set()  # those that sent their request line
        self.opened = self.closed_by_server = self.most_open = 0
        self.reopen: list[float] = []  # when each connection still to be (re)opened is due, a heap
        self.stopped = False  # a line (or the end) on stdin

    def open_one(self, index: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        if self.mode == "pipeline":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least (about 2 KiB)
        sock.bind((self.origin or source_address(index, self.sources), 0))
        err = sock.connect_ex(("127.0.0.1", self.port))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            heapq.heappush(self.reopen, time.monotonic() + random.uniform(*REOPEN_AFTER_S))
            return
        self.opened += 1
        fd = sock.fileno()
        self.socks[fd] = sock
        self.next_line[fd] = time.monotonic() if self.mode != "connect" else float("inf")
        self.epoll.register(fd, HUNG_UP if self.mode == "pipeline" else select.EPOLLIN | HUNG_UP)

    def drop(self, fd: int) -> None:
        sock = self.socks.pop(fd)
        self.epoll.unregister(fd)
        del self.next_line[fd]
        self.started.discard(fd)
        sock.close()
        self.closed_by_server += 1
        heapq.heappush(self.reopen, time.monotonic() + random.uniform(*REOPEN_AFTER_S))

    def tick(self) -> None:
        now = time.monotonic()
        for _ in range(OPEN_PER_TICK):
            if not self.reopen or self.reopen[0] > now:
                break
            heapq.heappop(self.reopen)
            self.open_one(self.opened)
        for fd, due in list(self.next_line.items()):
            if due <= now:
                self.send_next(fd, now)
        for fd, events in self.epoll.poll(0.05):
            if fd == 0:
                self.stopped = True
                continue
            if fd not in self.socks:
                continue
            if events & select.EPOLLIN and not events & HUNG_UP:
                try:
                    data = self.socks[fd].recv(4096)
                except OSError:
                    data = b""
                if data:
                    continue
            self.drop(fd)  # closed by the server (or an error page, then closed): open another
        self.most_open = max(self.most_open, len(self.socks))

    def send_next(self, fd: int, now: float) -> None:
        if self.mode == "pipeline":
            line = PIPELINE
        elif fd in self.started:
            line = b"X-Slow-%d: a\r\n" % random.randrange(10**6)
        else:
            line = b"GET /metrics HTTP/1.1\r\n"
        try:
            self.socks[fd].send(line)
        except BlockingIOError:  # still connecting: try again soon
            return
        except OSError:
            self.drop(fd)
            return
        self.started.add(fd)
        self.next_line[fd] = float("inf") if self.mode == "pipeline" else now + random.uniform(*HEADER_EVERY_S)

    def run(self, seconds: float) -> dict[str, int]:
        self.reopen = [time.monotonic()] * self.count
        try:
            self.epoll.register(0, select.EPOLLIN)
        except PermissionError:  # stdin is a file (/dev/null): only SECONDS end the run
            pass
        deadline, announced = time.monotonic() + seconds, False
        while time.monotonic() < deadline and not self.stopped:
            self.tick()
            if not announced and self.opened >= self.count:
                print("ready", flush=True)
                announced = True
        return {"opened": self.opened, "closed_by_server": self.closed_by_server, "most_open": self.most_open}


def main(argv: list[str]) -> None:
    port, count, mode, sources, seconds = int(argv[0]), int(argv[1]), argv[2], int(argv[3]), float(argv[4])
    raise_fd_limit(count + 256)
    print(json.dumps(Clients(port, count, mode, sources, argv[5] if len(argv) > 5 else None).run(seconds)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
