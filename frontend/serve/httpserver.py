"""serve's HTTP server: one asyncio event loop reads every connection's request head, h11 parses it, and a
worker thread answers it (routes.py); the loop then writes the answer out.

Chosen over the threading server it replaces (a handler thread per connection, 128 at most, each held up
to 60 s: 600 clients sending a header line every few seconds made 11 of 12 scrapes fail) and over
waitress (reads heads asynchronously too, but has no TLS, a select() loop that stops at descriptor 1023
unless told to poll, and no per-address limit or whole-request deadline): a slow client here costs a
few kilobytes of the loop's memory and nothing of a worker, whatever it trickles. h11 (python-hyper's
HTTP/1.1 state machine) parses and frames; this module only moves bytes and keeps the limits:

- **connections**: at most MAX_PER_ADDRESS per client address and the descriptor limit's worth in all
  (MAX_CONNECTIONS, the soft RLIMIT_NOFILE raised to the hard one less FD_RESERVE): a new connection
  that does not fit pushes out the connection that has waited longest for its request (connlimits.py),
  so idle and trickling sockets cannot keep a scraper out, even from its own address;
- **time**: the first byte of a request within FIRST_BYTE_S of the connection (the TLS handshake
  included), its whole head within HEAD_S (each cut somewhere in the last half of that, so a flood's
  connections are not all cut in one pass); a kept-alive connection waits KEEPALIVE_S for its next
  request; an answer must be written within WRITE_S (a client that reads slowly is cut then);
- **size**: a request head of at most MAX_HEAD_BYTES and MAX_HEADERS header lines (else 431); a body
  is not read, and its connection is closed after the answer;
- **work**: at most WORKERS answers are built at once (a page render, a bcrypt check, a profile's
  N seconds: those are bounded on their own, routes.py), the rest wait in the loop, not in threads.

The TLS context is taken per accepted connection (a web config reloaded by SIGHUP applies to the next
connection; users and headers to the next request) and the handshake runs in the loop (channel.py),
under the first-byte deadline.
"""
from __future__ import annotations

import asyncio
import random
import resource
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import unquote

import h11

from optrace.errors import OptraceError
from optrace.fileaccess import printable
from optrace.frontend.serve.channel import PlainChannel, TlsChannel
from optrace.frontend.serve.connlimits import Connection, ConnectionLimits
from optrace.frontend.serve.routes import (Endpoint, ProfileCollector, Request, Response, Routes, endpoint_for,
                                           text_response)
from optrace.frontend.serve.webconfig import TlsFiles, WebConfig

LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
MAX_CONNECTIONS = 4096
MAX_PER_ADDRESS = 256
FD_RESERVE = 1024  # descriptors kept for the profiler (perf events, BPF maps, probes, files being read)
FIRST_BYTE_S = 10.0
HEAD_S = 20.0
KEEPALIVE_S = 60.0
WRITE_S = 60.0
MAX_HEAD_BYTES = 16 << 10
MAX_HEADERS = 100
WORKERS = 32
WRITE_CHUNK = 64 << 10
CLOSE_S = 5.0  # serve's stop: connections still open after this are dropped
WARN_AGAIN_S = 60.0

__all__ = ["ListenAddress", "MetricsServer", "TlsFiles", "WebConfig"]


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def connection_limit() -> int:
    """Connections the server may hold: the soft descriptor limit is raised to the hard one (as Go's
    runtime does) up to what MAX_CONNECTIONS needs, and FD_RESERVE of it is left to the rest of serve."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_CONNECTIONS + FD_RESERVE
    if soft < wanted and (hard == resource.RLIM_INFINITY or soft < hard):
        soft = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return min(MAX_CONNECTIONS, max(soft - FD_RESERVE, soft // 2))


class _Warnings:
    """One line on stderr per kind of problem, again only after WARN_AGAIN_S: a flood of one error
    (descriptors exhausted) does not flood the journal."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def warn(self, kind: str, detail: object) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -WARN_AGAIN_S) < WARN_AGAIN_S:
            return
        self._last[kind] = now
        print(f"optrace: warning: {kind}: {printable(detail)[:200]}", file=sys.stderr, flush=True)


def _spread(seconds: float) -> float:
    """A deadline between half of ``seconds`` and all of it: connections opened together (a flood) are not
    all cut in the same pass of the loop, and their clients do not all come back together."""
    return seconds * random.uniform(0.5, 1.0)


def _request(event: h11.Request, client: str) -> Request:
    target = event.target.decode("latin-1")
    path, _, query = target.partition("?")
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
    return Request(event.method.decode("latin-1"), unquote(path, "latin-1"), query, client, headers)


class _Conversation:
    """One connection: request heads read under the deadlines, answers written under WRITE_S."""

    def __init__(self, server: MetricsServer, conn: Connection, channel: PlainChannel) -> None:
        self.server, self.conn, self.channel = server, conn, channel
        self.protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.loop = asyncio.get_running_loop()

    async def run(self) -> None:
        started = self.loop.time()
        first_byte_due = started + _spread(FIRST_BYTE_S)
        if isinstance(self.channel, TlsChannel):
            async with asyncio.timeout_at(first_byte_due):
                await self.channel.handshake()
        while True:
            event = await self._head(first_byte_due, started)
            if event is None:
                return
            self.server.limits.answering(self.conn)
            response = await self.server.answer(_request(event, self.conn.address))
            async with asyncio.timeout(WRITE_S):
                await self._send(response, head_only=event.method == b"HEAD")
            if self.protocol.our_state is not h11.DONE or self.protocol.their_state is not h11.DONE:
                return
            self.protocol.start_next_cycle()
            self.server.limits.waiting(self.conn)
            started, first_byte_due = None, self.loop.time() + KEEPALIVE_S

    async def _head(self, first_byte_due: float, started: float | None) -> h11.Request | None:
        """The next request's head, or None once the client is gone or was answered with an error. Until
        its first byte the wait ends at ``first_byte_due``; the whole head is due HEAD_S after ``started``
        (the connection's accept), or for a kept-alive connection after its first byte."""
        head_due = None if started is None else started + _spread(HEAD_S)
        while True:
            try:
                event = self.protocol.next_event()
            except h11.RemoteProtocolError as error:
                await self._refuse(error.error_status_hint, "bad request")
                return None
            if isinstance(event, h11.Request):
                if len(event.headers) <= MAX_HEADERS:
                    self._end_of_request()
                    return event
                await self._refuse(431, f"more than {MAX_HEADERS} header lines")
                return None
            if event is not h11.NEED_DATA:
                return None  # ConnectionClosed, or PAUSED after a request whose body was not read
            began = bool(self.protocol.trailing_data[0])
            if began and head_due is None:
                head_due = self.loop.time() + _spread(HEAD_S)
            async with asyncio.timeout_at(head_due if began else min(first_byte_due, head_due or first_byte_due)):
                data = await self.channel.read()
            self.protocol.receive_data(data)

    def _end_of_request(self) -> None:
        """Takes the end of a request without a body, so the connection can be kept alive; a body is not
        read (its connection is closed after the answer)."""
        try:
            self.protocol.next_event()
        except h11.RemoteProtocolError:
            pass

    async def _send(self, response: Response, head_only: bool) -> None:
        headers = [*response.headers, ("Content-Length", str(len(response.body)))]
        start = h11.Response(status_code=response.status, reason=response.reason.encode(), headers=headers)
        self.channel.write(b"".join(self.protocol.send_with_data_passthrough(start)))
        body = memoryview(response.body)
        for offset in range(0, 0 if head_only else len(body), WRITE_CHUNK):
            for part in self.protocol.send_with_data_passthrough(h11.Data(body[offset:offset + WRITE_CHUNK])):
                self.channel.write(part)
            await self.channel.drain()
        self.channel.write(self.protocol.send(h11.EndOfMessage()))
        await self.channel.drain()

    async def _refuse(self, status: int, message: str) -> None:
        """An error answer to a request that could not be read, if the protocol still allows one."""
        if self.protocol.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        reason = {400: "Bad Request", 431: "Request Header Fields Too Large"}.get(status, "Bad Request")
        response = text_response(status, reason, message, [("Connection", "close")])
        async with asyncio.timeout(FIRST_BYTE_S):
            await self._send(response, head_only=False)


class MetricsServer:
    """Owns the listening socket, the event loop's thread and the workers; :meth:`close` stops them.

    The port is bound at construction (a busy port fails early, bad TLS files before it); requests
    are served from :meth:`start` on; :meth:`configure` applies a reloaded web config."""

    def __init__(self, address: ListenAddress, web: WebConfig | None = None) -> None:
        try:
            family = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)[0][0]
        except socket.gaierror as exc:
            raise OptraceError(f"cannot listen on {address}: {exc.strerror}") from None
        self.endpoint: Endpoint = endpoint_for(web or WebConfig())  # bad files fail before the port is taken
        try:
            self._sock = socket.create_server((address.host, address.port), family=family, backlog=LISTEN_BACKLOG,
                                              dualstack_ipv6=family == socket.AF_INET6 and socket.has_dualstack_ipv6())
        except OSError as exc:
            raise OptraceError(f"cannot listen on {address}: {exc.strerror}: choose another --listen") from None
        self.address = ListenAddress(address.host, self._sock.getsockname()[1])
        self.limits = ConnectionLimits(MAX_PER_ADDRESS, connection_limit())
        self._warnings = _Warnings()
        self._routes: Routes | None = None
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="optrace-http")
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_problem)
        self._thread: threading.Thread | None = None
        self._listener: asyncio.Server | None = None
        self._serving = threading.Event()

    @property
    def url(self) -> str:
        return f"{self.endpoint.scheme}://{self.address}/metrics"

    def configure(self, web: WebConfig) -> None:
        """Use ``web`` from the next connection (TLS) and request (users, headers) on; raises
        OptraceError, keeping the current one, if its TLS files cannot be used."""
        self.endpoint = endpoint_for(web)

    def start(self, render: Callable[[], bytes], profile: ProfileCollector | None = None) -> None:
        self._routes = Routes(render, profile)
        self._thread = threading.Thread(target=self._run, name="optrace-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops accepting, drops the connections waiting for a request, lets those being answered finish
        (a profile request that serve's stop just answered with 503) for up to CLOSE_S, then stops."""
        if self._thread is not None and self._thread.is_alive():
            self._serving.wait(CLOSE_S)  # a stop right after start: the listener exists before it is closed
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._wind_down()))
            self._thread.join(CLOSE_S * 2)
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._sock.close()

    async def answer(self, request: Request) -> Response:
        """The routes' answer, built on a worker; a bug there is one warning and a 500, never the server."""
        try:
            return await self._loop.run_in_executor(self._workers, self._routes.respond, request, self.endpoint)
        except Exception as error:  # noqa: BLE001 - the per-request boundary
            self._warnings.warn("request failed", f"{type(error).__name__}: {error}")
            return text_response(500, "Internal Server Error", "internal error")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._listener = self._loop.run_until_complete(asyncio.start_server(self._connected, sock=self._sock,
                                                                            backlog=LISTEN_BACKLOG))
        self._serving.set()
        self._loop.run_forever()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_S))
        self._loop.close()

    async def _wind_down(self) -> None:
        self._listener.close()
        self.limits.drop_waiting()
        answering = asyncio.all_tasks() - {asyncio.current_task()}
        if answering:
            await asyncio.wait(answering, timeout=CLOSE_S)
        self._loop.stop()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = Connection(peer[0] if peer else "", writer.transport.abort)
        if not self.limits.admit(conn):
            return
        context = self.endpoint.context
        channel = TlsChannel(reader, writer, context) if context is not None else PlainChannel(reader, writer)
        clean = False
        try:
            await _Conversation(self, conn, channel).run()
            channel.finish()
            clean = True
        except ssl.SSLError:
            clean = True  # a refused handshake: its alert goes out before the close
        except (OSError, TimeoutError, EOFError, h11.ProtocolError):
            pass  # a client that hangs up, is too slow or fails the TLS handshake is its own problem
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the per-connection boundary
            self._warnings.warn("connection failed", f"{type(error).__name__}: {error}")
        finally:
            self.limits.release(conn)
            await self._hang_up(writer, clean)

    async def _hang_up(self, writer: asyncio.StreamWriter, clean: bool) -> None:
        """Closes after what was written has gone (bounded), or at once after a failure."""
        if not clean:
            writer.transport.abort()
            return
        writer.close()
        try:
            async with asyncio.timeout(CLOSE_S):
                await writer.wait_closed()
        except (OSError, TimeoutError):
            writer.transport.abort()

    def _loop_problem(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """asyncio's own reports (accept() out of descriptors, a transport error): one line, not a
        traceback; a client's disconnect is not worth one."""
        error = context.get("exception")
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        self._warnings.warn("http server", f"{context.get('message', '')}: {error or ''}")
