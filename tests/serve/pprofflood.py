"""A flood of `/debug/pprof/profile` requests (issue 40, item 5): COUNT connections from SOURCES loopback
addresses, each pipelining 20 requests for 5 s windows and reading the answers; a connection the server
closes is opened again at once. For SECONDS.

    python pprofflood.py PORT COUNT SOURCES SECONDS

Prints ``ready`` once the connections are opened, then one JSON line: answers by status."""
from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from collections import Counter

REQUESTS = b"GET /debug/pprof/profile?seconds=5 HTTP/1.1\r\nHost: optrace\r\n\r\n" * 20


def main(argv: list[str]) -> None:
    port, count, sources, seconds = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    selector = selectors.DefaultSelector()
    statuses: Counter[str] = Counter()
    opened = 0

    def open_one() -> None:
        nonlocal opened
        n = 1 + opened % sources
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((f"127.0.{2 + n // 250}.{1 + n % 250}", 0))
        sock.connect_ex(("127.0.0.1", port))
        selector.register(sock, selectors.EVENT_WRITE)
        opened += 1

    for _ in range(count):
        open_one()
    print("ready", flush=True)
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        for key, events in selector.select(0.1):
            sock = key.fileobj
            if events & selectors.EVENT_WRITE:
                try:
                    sock.send(REQUESTS)
                except OSError:
                    pass
                selector.modify(sock, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                open_one()
                continue
            statuses.update(line[9:12].decode() for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.1 "))
    print(json.dumps(dict(statuses)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
