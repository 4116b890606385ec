"""The bytes of one HTTP connection, on its non-blocking socket: as they are (:class:`PlainChannel`) or
through TLS (:class:`TlsChannel`).

Nothing is read unless the conversation asks (no read-ahead buffer: requests a client pipelines behind one
whose answer it does not read stay in the kernel), and answers are sent straight from the caller's bytes
(``sendmsg`` of memoryviews, no copy per connection). Every send the kernel takes bytes of is reported as
progress (connlimits.py); how long a read or a send may wait is the caller's (its task is cancelled).

TLS runs here on an ``ssl.SSLObject`` over memory buffers rather than through asyncio's ``start_tls``:
asyncio (3.11) drops what OpenSSL wrote when a handshake fails, so a client refused for its TLS
version or certificate saw the connection closed (EOF) instead of the alert that says why; here the alert
is sent before the connection is closed. The handshake is only as long as the caller's deadline allows.
An answer is encrypted TLS_CHUNK at a time, the next chunk only once the last one's ciphertext has gone:
a TLS connection holds at most one chunk of its own.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import Callable

READ_BYTES = 4 << 10
TLS_CHUNK = 16 << 10  # one TLS record's worth
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset and drops what is unsent


def _nothing() -> None:
    pass


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class PlainChannel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()

    async def read(self, limit: int = READ_BYTES) -> bytes:
        """What came next, at most ``limit`` bytes (b"" once the client is done sending)."""
        return await self.loop.sock_recv(self.sock, min(limit, READ_BYTES))

    async def send(self, *parts: bytes | memoryview, progressed: Callable[[], None] = _nothing) -> None:
        """All of ``parts``, in order, without copying them; ``progressed`` each time the kernel takes some."""
        views = [memoryview(part).cast("B") for part in parts if len(part)]
        while views:
            try:
                sent = self.sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if not sent:
                waiter = self.loop.create_future()
                self.loop.add_writer(self.sock, _wake, waiter)
                try:
                    await waiter
                finally:
                    self.loop.remove_writer(self.sock)
                continue
            progressed()
            while sent:
                if sent >= len(views[0]):
                    sent -= len(views.pop(0))
                else:
                    views[0], sent = views[0][sent:], 0

    async def finish(self) -> None:
        """Nothing more will be written."""

    async def linger(self, seconds: float, max_bytes: int) -> None:
        """Says it is done (FIN), then reads and drops what the client still sends, up to ``max_bytes``
        for ``seconds``: closed with unread bytes, a socket resets, and the client may lose the answer
        that was sent last (a 431, a 400) before reading it."""
        self.sock.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(seconds):
            while max_bytes > 0 and (data := await self.loop.sock_recv(self.sock, READ_BYTES)):
                max_bytes -= len(data)

    def close(self, clean: bool) -> None:
        """Closes the socket: after what was sent has gone, or (``clean`` False) at once, with a reset."""
        if not clean:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            except OSError:
                pass
        self.sock.close()


class TlsChannel(PlainChannel):
    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        super().__init__(sock)
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)

    async def handshake(self) -> None:
        """Raises ssl.SSLError (its alert sent) or ConnectionError when the client hangs up first."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                await self._send_pending()
                if not await self._receive():
                    raise ConnectionResetError("the client hung up during the TLS handshake") from None
                continue
            except ssl.SSLError:
                await self._send_pending()  # the alert
                raise
            await self._send_pending()
            return

    async def read(self, limit: int = READ_BYTES) -> bytes:
        while True:
            try:
                return self._tls.read(min(limit, READ_BYTES))
            except ssl.SSLWantReadError:
                await self._send_pending()  # TLS 1.3 may have something to say first (session tickets)
                if not await self._receive():
                    return b""
            except ssl.SSLZeroReturnError:  # the client's close_notify
                return b""

    async def send(self, *parts: bytes | memoryview, progressed: Callable[[], None] = _nothing) -> None:
        for part in parts:
            view = memoryview(part).cast("B")
            for offset in range(0, len(view), TLS_CHUNK):
                self._tls.write(view[offset:offset + TLS_CHUNK])  # into memory: renegotiation is off (tls_context)
                await self._send_pending(progressed)

    async def finish(self) -> None:
        try:
            self._tls.unwrap()  # our close_notify; the client's is not waited for
        except ssl.SSLError:
            pass
        await self._send_pending()

    async def _receive(self) -> bool:
        data = await self.loop.sock_recv(self.sock, READ_BYTES)
        if not data:
            self._incoming.write_eof()
            return False
        self._incoming.write(data)
        return True

    async def _send_pending(self, progressed: Callable[[], None] = _nothing) -> None:
        pending = self._outgoing.read()
        if pending:
            await PlainChannel.send(self, pending, progressed=progressed)
