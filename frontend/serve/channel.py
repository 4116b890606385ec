"""The bytes of one HTTP connection: as they are (:class:`PlainChannel`) or through TLS (:class:`TlsChannel`).

TLS runs here on an ``ssl.SSLObject`` over memory buffers rather than through asyncio's ``start_tls``:
asyncio (3.11) drops what OpenSSL wrote when a handshake fails, so a client refused for its TLS
version or certificate saw the connection closed (EOF) instead of the alert that says why; here the alert
is sent before the connection is closed. The handshake is only as long as the caller's deadline allows.
Writes are encrypted as they are made and leave through the stream's own flow control (``drain``).
"""
from __future__ import annotations

import asyncio
import ssl

READ_BYTES = 16 << 10


class PlainChannel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def read(self) -> bytes:
        """What came next (b"" once the client is done sending)."""
        return await self.reader.read(READ_BYTES)

    def write(self, data: bytes | memoryview) -> None:
        self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    def finish(self) -> None:
        """Nothing more will be written."""


class TlsChannel(PlainChannel):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> None:
        super().__init__(reader, writer)
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)

    async def handshake(self) -> None:
        """Raises ssl.SSLError (its alert sent) or ConnectionError when the client hangs up first."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                self._send_pending()
                if not await self._receive():
                    raise ConnectionResetError("the client hung up during the TLS handshake") from None
                continue
            except ssl.SSLError:
                self._send_pending()  # the alert
                await self.writer.drain()
                raise
            self._send_pending()
            return

    async def read(self) -> bytes:
        while True:
            try:
                return self._tls.read(READ_BYTES)
            except ssl.SSLWantReadError:
                self._send_pending()  # TLS 1.3 may have something to say first (session tickets)
                if not await self._receive():
                    return b""
            except ssl.SSLZeroReturnError:  # the client's close_notify
                return b""

    def write(self, data: bytes | memoryview) -> None:
        self._tls.write(data)  # into memory: never "want write"; renegotiation is off (tls_context)
        self._send_pending()

    def finish(self) -> None:
        try:
            self._tls.unwrap()  # our close_notify; the client's is not waited for
        except ssl.SSLError:
            pass
        self._send_pending()

    async def _receive(self) -> bool:
        data = await self.reader.read(READ_BYTES)
        if not data:
            self._incoming.write_eof()
            return False
        self._incoming.write(data)
        return True

    def _send_pending(self) -> None:
        pending = self._outgoing.read()
        if pending:
            self.writer.write(pending)
