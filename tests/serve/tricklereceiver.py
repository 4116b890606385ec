"""A receiver that trickles its answer (issue 40): it takes whatever a sender sends and answers one byte
every ``every_s`` seconds, never finishing within a test: for OTLP/HTTP the head and body of a 200, for
OTLP/gRPC the HTTP/2 server preface (a SETTINGS frame) and nothing more. Each byte comes well within any
per-read timeout, so only a deadline on the whole request ends a try."""
from __future__ import annotations

import socket
import threading

HTTP_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 64\r\n\r\n" + bytes(64)
GRPC_ANSWER = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" * 8  # empty SETTINGS frames, one after another
ANSWERS = {"http/protobuf": HTTP_ANSWER, "grpc": GRPC_ANSWER}


class TricklingReceiver:
    def __init__(self, protocol: str, every_s: float = 1.0) -> None:
        self.answer, self.every_s = ANSWERS[protocol], every_s
        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # stopped
                return
            self.connections += 1
            for target in (self._drain, self._trickle):
                thread = threading.Thread(target=target, args=(conn,), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _drain(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        while not self._stop.is_set():
            try:
                if not conn.recv(65536):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            for byte in self.answer:
                if self._stop.wait(self.every_s):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
            self._stop.wait()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(5)
