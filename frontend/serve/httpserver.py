"""serve's HTTP server: one asyncio event loop accepts every connection and reads its request heads on the
bare non-blocking socket, h11 parses them, a worker thread builds each answer (routes.py), and the loop
writes the answer out from the answer's own bytes.

Chosen over the threading server it replaces (a handler thread per connection, 128 at most, each held up
to 60 s: 600 clients sending a header line every few seconds made 11 of 12 scrapes fail), over asyncio's
streams (each connection read ahead into a buffer of its own and copied what the kernel would not take of
an answer into another: 4,352 sockets that never read took serve to 575 MB, issue 40) and over waitress
(reads heads asynchronously too, but has no TLS, a select() loop that stops at descriptor 1023 unless told
to poll, and no per-address limit or whole-request deadline). h11 (python-hyper's HTTP/1.1 state machine)
parses and frames; this module only moves bytes and keeps the limits:

- **connections**: at most MAX_PER_ADDRESS per client (an IPv4 address, an IPv6 /64) and MAX_CONNECTIONS
  in all (MAX_TLS_CONNECTIONS with TLS: OpenSSL keeps its record buffers per connection; fewer when the
  descriptor limit, raised to the hard one, leaves less than that above FD_RESERVE). A new connection is
  always let in: the one that has made no progress for the longest (connlimits.py: accept, a whole request
  head, answer bytes the kernel took) gives way, whatever its state, first among its client's, then among
  all;
- **time**: the first byte of a request within FIRST_BYTE_S of the connection (the TLS handshake
  included), its whole head within HEAD_S (each cut somewhere in the last half of that, so a flood's
  connections are not all cut in one pass); a kept-alive connection waits KEEPALIVE_S for its next
  request; an answer is cut when the client takes none of it for WRITE_STALL_S, and when it is not all
  written within WRITE_S. Each deadline is the connection's ``due`` time, which one sweep of the loop
  enforces every SWEEP_S (no timer per wait);
- **requests**: read one at a time: the next is read only once the last answer is written, so requests
  pipelined behind an answer the client does not read wait in the kernel, not here; one request a turn
  of the loop per connection. A head of at most MAX_HEAD_BYTES (read no further than that) and MAX_HEADERS
  header lines, else 431; a request with a body (Transfer-Encoding, or a Content-Length other than 0) is
  answered and its connection closed, the body and anything after it never taken as a request; one with
  both Transfer-Encoding and Content-Length is refused (400). An absolute-form target is served by its path;
- **memory**: a connection holds its socket, its parser and the request bytes read and not answered;
  those bytes stay within REQUEST_BYTES in all. Answers are sent from their bytes, never copied per
  connection (the page of a drain is one object whoever is sent it), and the bodies being written stay
  within ANSWER_BYTES, each counted once (connlimits.py). glibc is asked to give freed memory back
  (optrace/heap.py) once a crowd of connections has gone;
- **refusals**: a client's 4xx answers (a 401 without valid credentials above all) come REFUSAL_BURST at
  once, then REFUSAL_RATE a second (refusals.py); past that a refusal waits for its client's turn, its
  connection first in line to give way, nothing more read from it. A client with valid credentials is
  never paced, whatever others from its address do;
- **work**: an answer that needs no waiting (the page of this drain, rendered already; an error; a
  refused profile window) is given by the loop at once; at most WORKERS others are built at once (a page
  render, a bcrypt check, a profile's N seconds: those are bounded on their own, routes.py), the rest
  wait in the loop, not in threads.

The TLS context is taken per accepted connection (a web config reloaded by SIGHUP applies to the next
connection; users and headers to the next request) and the handshake runs in the loop (channel.py),
under the first-byte deadline.
"""
from __future__ import annotations

import asyncio
import errno
import ipaddress
import math
import random
import resource
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from urllib.parse import unquote, urlsplit

import h11
from prometheus_client.registry import Collector

from optrace.errors import OptraceError
from optrace.fileaccess import printable
from optrace.frontend.serve.channel import PlainChannel, TlsChannel
from optrace.frontend.serve.connlimits import Connection, ConnectionLimits
from optrace.frontend.serve.connmetrics import ConnectionsCollector
from optrace.frontend.serve.refusals import RefusalPace
from optrace.frontend.serve.routes import (CurrentPage, Endpoint, PageSource, ProfileCollector, Request, Response,
                                           Routes, endpoint_for, text_response)
from optrace.frontend.serve.webconfig import TlsFiles, WebConfig
from optrace.heap import release_free_memory

LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
MAX_CONNECTIONS = 4096
MAX_TLS_CONNECTIONS = 512  # OpenSSL keeps ~34 KB of record buffers per connection (36 KB each, measured)
MAX_PER_ADDRESS = 256
FD_RESERVE = 1024  # descriptors kept for the profiler (perf events, BPF maps, probes, files being read)
FIRST_BYTE_S = 10.0
HEAD_S = 20.0
KEEPALIVE_S = 60.0
WRITE_STALL_S = 5.0
WRITE_S = 60.0
MAX_HEAD_BYTES = 8 << 10
MAX_HEADERS = 100
REQUEST_BYTES = 8 << 20  # request bytes read and not answered yet, all connections together
ANSWER_BYTES = 16 << 20  # answer bodies being written, each counted once
WORKERS = 32
REFUSAL_BURST = 20  # refusals (4xx) a client gets at once ...
REFUSAL_RATE = 5.0  # ... and a second after that (refusals.py)
ACCEPT_BATCH = 256  # connections accepted per pass of the loop
SWEEP_S = 0.25  # how often deadlines are looked at (each is kept to within this)
ACCEPT_PAUSE_S = 0.5  # out of descriptors: accepting again after this
CLOSE_S = 5.0  # serve's stop: connections still open after this are dropped
LINGER_S = 2.0  # after an answer to a request not read whole: how long its client's bytes are taken and dropped
LINGER_BYTES = 64 << 10  # ... and how many at most
TIDY_S = 10.0  # how often the loop looks whether to give freed memory back
TIDY_GONE = 256  # ... which it does once this many connections fewer are held than at the peak since
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


def client_of(address: str) -> str:
    """The client a peer address counts for: the address itself, an IPv4-mapped one as IPv4, an IPv6 one
    by its /64 (what one host or site is given: a client with a /64 is not 2^64 clients)."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return address


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


def _nothing() -> None:
    pass


def _spread(seconds: float) -> float:
    """A deadline between half of ``seconds`` and all of it: connections opened together (a flood) are not
    all cut in the same pass of the loop, and their clients do not all come back together."""
    return seconds * random.uniform(0.5, 1.0)


def _request(event: h11.Request, client: str) -> Request:
    target = event.target.decode("latin-1")
    if target[:8].lower().startswith(("http://", "https://")):  # the absolute form, which a server must accept
        url = urlsplit(target)
        target = f"{url.path or '/'}?{url.query}" if url.query else url.path or "/"
    path, _, query = target.partition("?")
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
    return Request(event.method.decode("latin-1"), unquote(path, "latin-1"), query, client, headers)


def _has_body(event: h11.Request) -> bool:
    """Whether a request says a body follows. A body is never read: its connection is closed after the
    answer, and nothing the client sent after the head is taken as a request (no smuggling through a body
    framed one way by a proxy and another here)."""
    return any(name == b"transfer-encoding" or (name == b"content-length" and value != b"0")
               for name, value in event.headers)


def _refused(event: h11.Request) -> tuple[int, str] | None:
    """A request head answered with an error (and its connection closed) rather than served."""
    if len(event.headers) > MAX_HEADERS:
        return 431, f"more than {MAX_HEADERS} header lines"
    names = {name for name, _ in event.headers}
    if b"transfer-encoding" in names and b"content-length" in names:  # RFC 9112 6.3: a smuggling attempt
        return 400, "both Transfer-Encoding and Content-Length"
    return None


class _Conversation:
    """One connection: request heads read under the deadlines, one at a time, answers written under
    WRITE_STALL_S and WRITE_S. A deadline is the connection's ``due`` time, which the server's sweep
    enforces (one timer for all connections, not one per wait)."""

    def __init__(self, server: MetricsServer, conn: Connection, sock: socket.socket,
                 context: ssl.SSLContext | None) -> None:
        self.server, self.conn = server, conn
        self.channel = TlsChannel(sock, context) if context else PlainChannel(sock)
        self.protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.loop = asyncio.get_running_loop()
        self._write_due = math.inf

    async def run(self) -> None:
        started = self.loop.time()
        first_byte_due = started + _spread(FIRST_BYTE_S)
        if isinstance(self.channel, TlsChannel):
            self.conn.due = first_byte_due
            await self.channel.handshake()
        limits = self.server.limits
        while True:
            request = await self._head(first_byte_due, started)
            if request is None:
                return
            self.conn.answering, self.conn.due = True, math.inf
            limits.building(self.conn)
            response = await self.server.answer(request)
            limits.built(self.conn)
            if 400 <= response.status < 500:
                await self._turn_to_refuse()
            head_only = request.method == "HEAD"
            parts = self._framed(response, head_only)
            limits.writing(self.conn, b"" if head_only else response.body)
            del request, response  # a client that does not read holds its answer's bytes, nothing more
            self._writing(WRITE_S)
            await self.channel.send(*parts, progressed=self._progressed)
            limits.written(self.conn)
            if self.protocol.our_state is not h11.DONE or self.protocol.their_state is not h11.DONE:
                return
            self.protocol.start_next_cycle()
            self.conn.answering = False
            started, first_byte_due = None, self.loop.time() + KEEPALIVE_S
            await asyncio.sleep(0)  # one request a turn: a client that pipelines without end shares the loop

    async def _turn_to_refuse(self) -> None:
        """A refusal past its client's burst waits for the client's turn (refusals.py), its connection
        first in line to give way and dropped at serve's stop, as one waiting for a request is."""
        waiter = self.server.refusals.turn(self.conn.address, self.loop.time())
        if waiter is None:
            return
        self.server.limits.demote(self.conn)
        self.conn.answering, self.conn.due = False, self.loop.time() + KEEPALIVE_S
        await waiter
        self.conn.answering, self.conn.due = True, math.inf

    def _writing(self, seconds: float) -> None:
        """An answer starts: all of it is due in ``seconds``, and its next bytes in WRITE_STALL_S."""
        now = self.loop.time()
        self._write_due = now + seconds
        self.conn.due = min(now + WRITE_STALL_S, self._write_due)

    def _progressed(self) -> None:
        """The kernel took bytes of an answer."""
        self.server.limits.progressed(self.conn)
        self.conn.due = min(self.loop.time() + WRITE_STALL_S, self._write_due)

    async def _head(self, first_byte_due: float, started: float | None) -> Request | None:
        """The next request, or None once the client is gone or was answered with an error. Until
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
                refused = _refused(event)
                if refused:
                    await self._refuse(*refused)
                    return None
                if not _has_body(event):
                    self._end_of_request()
                self.server.limits.reading(self.conn, len(self.protocol.trailing_data[0]))  # pipelined ones
                return _request(event, self.conn.address)
            if event is not h11.NEED_DATA:
                return None  # ConnectionClosed, or PAUSED after a request whose body was not read
            began = self.conn.buffered > 0
            if began and head_due is None:
                head_due = self.loop.time() + _spread(HEAD_S)
            self.conn.due = head_due if began else min(first_byte_due, head_due or first_byte_due)
            # never more than the head's limit and a byte: h11 holds an incomplete head to it, not a whole one
            self.protocol.receive_data(await self.channel.read(MAX_HEAD_BYTES + 1 - self.conn.buffered))
            self.server.limits.reading(self.conn, len(self.protocol.trailing_data[0]))

    def _end_of_request(self) -> None:
        """Takes the end of a request without a body, so the connection can be kept alive."""
        try:
            self.protocol.next_event()
        except h11.RemoteProtocolError:
            pass

    def _framed(self, response: Response, head_only: bool) -> list[bytes]:
        """The answer's bytes to send: its head, its body as it is (h11 passes it through), its end."""
        headers = [*response.headers, ("Content-Length", str(len(response.body)))]
        if self.protocol.their_state is not h11.DONE and ("Connection", "close") not in headers:
            headers.append(("Connection", "close"))  # a body not read: nothing after it is either
        head = self.protocol.send(h11.Response(status_code=response.status, reason=response.reason.encode(),
                                               headers=headers))
        body = [] if head_only else self.protocol.send_with_data_passthrough(h11.Data(response.body))
        return [head, *body, self.protocol.send(h11.EndOfMessage())]

    async def _refuse(self, status: int, message: str) -> None:
        """An error answer to a request that could not be read, if the protocol still allows one."""
        if self.protocol.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        answer = text_response(status, HTTPStatus(status).phrase, message, [("Connection", "close")])
        parts = self._framed(answer, head_only=False)
        self._writing(FIRST_BYTE_S)
        await self.channel.send(*parts, progressed=self._progressed)


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
        self._sock.setblocking(False)
        self.address = ListenAddress(address.host, self._sock.getsockname()[1])
        self._descriptors = connection_limit()
        self.limits = ConnectionLimits(MAX_PER_ADDRESS, self._table_size(), REQUEST_BYTES, ANSWER_BYTES)
        self.refusals = RefusalPace(REFUSAL_RATE, REFUSAL_BURST, MAX_CONNECTIONS)
        self._warnings = _Warnings()
        self._routes: Routes | None = None
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="optrace-http")
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_problem)
        self._thread: threading.Thread | None = None
        self._conversations: set[asyncio.Task] = set()
        self._serving = threading.Event()

    @property
    def url(self) -> str:
        return f"{self.endpoint.scheme}://{self.address}/metrics"

    def configure(self, web: WebConfig) -> None:
        """Use ``web`` from the next connection (TLS) and request (users, headers) on; raises
        OptraceError, keeping the current one, if its TLS files cannot be used."""
        self.endpoint = endpoint_for(web)
        self._loop.call_soon_threadsafe(setattr, self.limits, "total", self._table_size())

    def _table_size(self) -> int:
        return min(self._descriptors, MAX_TLS_CONNECTIONS if self.endpoint.context else MAX_CONNECTIONS)

    def start(self, render: PageSource, profile: ProfileCollector | None = None,
              current: CurrentPage = lambda: None) -> None:
        """Serve the page ``render`` makes (``current``: the page already rendered, if any, without waiting)."""
        self._routes = Routes(render, profile, current)
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

    def collector(self) -> Collector:
        """Its connections and their bytes, for the page."""
        return ConnectionsCollector(self.limits, self.refusals)

    async def answer(self, request: Request) -> Response:
        """The routes' answer, given at once when it needs no waiting, else built on a worker; a bug there
        is one warning and a 500, never the server."""
        try:
            ready = self._routes.respond(request, self.endpoint, wait=False)
            if ready is not None:
                return ready
            return await self._loop.run_in_executor(self._workers, self._routes.respond, request, self.endpoint)
        except Exception as error:  # noqa: BLE001 - the per-request boundary
            self._warnings.warn("request failed", f"{type(error).__name__}: {error}")
            return text_response(500, "Internal Server Error", "internal error")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.add_reader(self._sock, self._accept)
        self._loop.call_later(SWEEP_S, self._sweep)
        self._loop.call_later(TIDY_S, self._tidy)
        self._serving.set()
        self._loop.run_forever()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_S))
        self._loop.close()

    async def _wind_down(self) -> None:
        self._loop.remove_reader(self._sock)
        for conn in self.limits.waiting():
            conn.close()
        answering = self._conversations - {asyncio.current_task()}
        if answering:
            await asyncio.wait(answering, timeout=CLOSE_S)
        self._loop.stop()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that one client's problem
                self._warnings.warn("accepting connections", error)  # out of descriptors or memory: pause
                self._loop.remove_reader(self._sock)
                self._loop.call_later(ACCEPT_PAUSE_S, self._loop.add_reader, self._sock, self._accept)
                return
            self._converse(sock, peer[0] if isinstance(peer, tuple) else "")

    def _converse(self, sock: socket.socket, peer: str) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(client_of(peer), _nothing)
        self.limits.admit(conn)
        conversation = _Conversation(self, conn, sock, self.endpoint.context)
        task = self._loop.create_task(self._conversation(conversation))
        conn.close = task.cancel
        self._conversations.add(task)
        task.add_done_callback(partial(self._ended, conversation))

    async def _conversation(self, conversation: _Conversation) -> bool:
        """True when it ended as the protocol wants (the socket is then closed after what was sent)."""
        try:
            await conversation.run()
            await conversation.channel.finish()
            if conversation.protocol.their_state is not h11.DONE:  # a body or an error: bytes not read
                await conversation.channel.linger(LINGER_S, LINGER_BYTES)
            return True
        except ssl.SSLError:
            return True  # a refused handshake: its alert went out before the close
        except (OSError, EOFError, h11.ProtocolError):
            return False  # a client that hangs up or fails the TLS handshake is its own problem
        except Exception as error:  # noqa: BLE001 - the per-connection boundary
            self._warnings.warn("connection failed", f"{type(error).__name__}: {error}")
            return False

    def _ended(self, conversation: _Conversation, task: asyncio.Task) -> None:
        """After the conversation, however it ended: cut (cancelled, perhaps before it began: too slow,
        or it gave way) or not."""
        self._conversations.discard(task)
        self.limits.release(conversation.conn)
        conversation.conn.close = _nothing  # the task's last reference: a cut one's traceback holds the conn
        conversation.channel.close(not task.cancelled() and task.exception() is None and task.result())

    def _sweep(self) -> None:
        """Cuts the connections past their deadline (a client too slow to send its request or to take
        its answer); lets go the refusals whose client's turn has come."""
        self.limits.cut_overdue(self._loop.time())
        self.refusals.release(self._loop.time())
        self._loop.call_later(SWEEP_S, self._sweep)

    def _tidy(self) -> None:
        """Gives freed memory back once a crowd of connections has gone (their objects were freed, but
        glibc keeps the heap they grew)."""
        if self.limits.reset_peak() - self.limits.held() >= TIDY_GONE:
            release_free_memory()
        self._loop.call_later(TIDY_S, self._tidy)

    def _loop_problem(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """asyncio's own reports (a callback's error): one line, not a traceback; a client's disconnect is
        not worth one."""
        error = context.get("exception")
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        self._warnings.warn("http server", f"{context.get('message', '')}: {error or ''}")
