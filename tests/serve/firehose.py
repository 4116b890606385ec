"""One connection that pipelines requests without end and reads every answer as fast as it comes, for a
bounded time (issue 40, item 5): the server must not give it the whole event loop.

    python firehose.py PORT SECONDS PATH

Prints ``ready`` once connected, then, at the end, the answer bytes it got."""
from __future__ import annotations

import socket
import sys
import threading
import time

BATCH = 2000  # requests per send


def main(argv: list[str]) -> None:
    port, seconds, path = int(argv[0]), float(argv[1]), argv[2]
    sock = socket.create_connection(("127.0.0.1", port))
    print("ready", flush=True)
    received = [0]
    batch = f"GET {path} HTTP/1.1\r\nHost: optrace\r\n\r\n".encode() * BATCH

    def read() -> None:
        try:
            while data := sock.recv(1 << 20):
                received[0] += len(data)
        except OSError:
            pass

    def send() -> None:
        try:
            while True:
                sock.sendall(batch)
        except OSError:
            pass

    threads = [threading.Thread(target=target, daemon=True) for target in (read, send)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    got = received[0]
    sock.shutdown(socket.SHUT_RDWR)  # ends both
    print(got, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
