"""Hostile HTTP clients held open against a server on loopback, for a bounded time, from one process.

    python slowclients.py PORT COUNT MODE SOURCES SECONDS

MODE ``slowloris``: each connection sends a request line, then one header line every few seconds (never
the blank line that ends the head); ``connect``: each connection only connects and sends nothing. A
connection the server closes is opened again a few seconds later (as slowloris tools do, in their next
round), so about COUNT stay open as long as the server keeps them.
Connections come from SOURCES distinct loopback addresses (127.0.1.2, 127.0.1.3, ...; every 127.x.y.z
answers on Linux's loopback), so per-address limits see many clients (or one: SOURCES 1).
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
import selectors
import socket
import sys
import time

HEADER_EVERY_S = (2.0, 4.0)  # each slowloris connection sends a header line this often (random, per line)
REOPEN_AFTER_S = (2.0, 4.0)  # a connection the server closed is opened again this much later
OPEN_PER_TICK = 200  # connections (re)opened per loop pass


def raise_fd_limit(wanted: int) -> None:
    """Root may raise the hard limit too; the kernel's fs.nr_open caps both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        with open("/proc/sys/fs/nr_open") as f:
            cap = int(f.read())
        new = min(max(wanted, soft), cap)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, max(hard, new)))


def source_address(index: int, sources: int) -> str:
    n = 1 + index % sources
    return f"127.0.{1 + n // 250}.{1 + n % 250}"


class Clients:
    def __init__(self, port: int, count: int, mode: str, sources: int) -> None:
        self.port, self.count, self.mode, self.sources = port, count, mode, sources
        self.selector = selectors.DefaultSelector()
        self.next_line: dict[socket.socket, float] = {}  # when each open connection sends its next line
        self.started: set[socket.socket] = set()  # those that sent their request line
        self.opened = self.closed_by_server = self.most_open = 0
        self.reopen: list[float] = []  # when each connection still to be (re)opened is due, a heap
        self.stopped = False  # a line (or the end) on stdin

    def open_one(self, index: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((source_address(index, self.sources), 0))
        err = sock.connect_ex(("127.0.0.1", self.port))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            heapq.heappush(self.reopen, time.monotonic() + random.uniform(*REOPEN_AFTER_S))
            return
        self.opened += 1
        self.next_line[sock] = time.monotonic() if self.mode == "slowloris" else float("inf")
        self.selector.register(sock, selectors.EVENT_READ)

    def drop(self, sock: socket.socket) -> None:
        self.selector.unregister(sock)
        del self.next_line[sock]
        self.started.discard(sock)
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
        for sock, due in list(self.next_line.items()):
            if due <= now:
                self.send_line(sock, now)
        for key, _ in self.selector.select(timeout=0.05):
            if key.fileobj is sys.stdin:
                self.stopped = True
                continue
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data:  # closed by the server (or an error page, then closed): open another
                self.drop(key.fileobj)
        self.most_open = max(self.most_open, len(self.next_line))

    def send_line(self, sock: socket.socket, now: float) -> None:
        line = b"X-Slow-%d: a\r\n" % random.randrange(10**6) if sock in self.started else b"GET /metrics HTTP/1.1\r\n"
        try:
            sock.send(line)
        except BlockingIOError:  # still connecting: try again soon
            return
        except OSError:
            self.drop(sock)
            return
        self.started.add(sock)
        self.next_line[sock] = now + random.uniform(*HEADER_EVERY_S)

    def run(self, seconds: float) -> dict[str, int]:
        self.reopen = [time.monotonic()] * self.count
        self.selector.register(sys.stdin, selectors.EVENT_READ)
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
    print(json.dumps(Clients(port, count, mode, sources).run(seconds)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
