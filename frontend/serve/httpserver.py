"""The scrape endpoint: `/metrics` (the page), `/` (a short HTML page pointing to it), with what the
web config asks for (TLS, basic auth, extra headers; see webconfig.py).

A small WSGI app on a threading server, rather than prometheus-client's ``start_http_server``, which
answers every path with the metrics and cannot serve `/`. How it holds up under load and abuse:

- the listen backlog holds LISTEN_BACKLOG connections (the kernel caps it at net.core.somaxconn), so
  a thousand scrapers arriving at once all wait to be answered rather than being dropped;
- at most MAX_HANDLERS requests are handled at once, each in its own thread; the next connections
  wait in the backlog, so a flood costs bounded threads and memory;
- every connection has REQUEST_DEADLINE_S in all (TLS handshake, request, response) before it is shut
  down, so clients that trickle bytes (slowloris) cannot keep the handlers;
- the TLS context is applied per accepted connection, and the handshake happens in the request's
  thread: a slow client never blocks accept(), and a reloaded web config (SIGHUP) applies to the
  next connection.
"""
from __future__ import annotations

import gzip
import html
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from optrace import __version__
from optrace.frontend.serve.profilewindows import WAIT_SLACK_S, WindowRefused, parse_seconds
from optrace.frontend.serve.metricspage import CONTENT_TYPE
from optrace.frontend.serve.webconfig import BasicAuth, TlsFiles, WebConfig, tls_context
from optrace.fileaccess import printable
from optrace.errors import OptraceError

REQUEST_TIMEOUT_S = 30.0  # one blocking read or the whole write of a response
REQUEST_DEADLINE_S = 60.0  # a connection in all
LISTEN_BACKLOG = 4096
MAX_HANDLERS = 128
ACCEPT_POLL_S = 0.5
PROFILE_PATH = "/debug/pprof/profile"  # Go's net/http/pprof
StartResponse = Callable[[str, list[tuple[str, str]]], object]
ProfileCollector = Callable[[str, int], bytes]  # (client address, seconds) -> gzipped pprof

__all__ = ["ListenAddress", "MetricsServer", "TlsFiles", "WebConfig", "metrics_app"]


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class _Endpoint:
    """What the web config makes of the endpoint, swapped whole when it is reloaded."""

    context: ssl.SSLContext | None
    auth: BasicAuth
    headers: list[tuple[str, str]]

    @property
    def scheme(self) -> str:
        return "https" if self.context else "http"


def _endpoint(web: WebConfig) -> _Endpoint:
    return _Endpoint(tls_context(web.tls) if web.tls else None, BasicAuth(web.users), list(web.headers.items()))


class _Deadlines:
    """Shuts down connections still open REQUEST_DEADLINE_S after they were accepted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[socket.socket, float] = {}

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._due[sock] = time.monotonic() + REQUEST_DEADLINE_S

    def extend(self, sock: socket.socket, seconds: float) -> None:
        """A profile request holds its connection for its N seconds: its deadline moves past them."""
        with self._lock:
            if sock in self._due:
                self._due[sock] = max(self._due[sock], time.monotonic() + seconds)

    def remove(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            now = time.monotonic()
            with self._lock:
                late = [sock for sock, due in self._due.items() if due < now]
            for sock in late:
                try:  # the plain socket's shutdown, also under TLS: the handler's blocked read returns
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not logged: one line per scrape would flood a service's journal."""

    def get_environ(self) -> dict:
        environ = super().get_environ()
        environ["optrace.extend_deadline"] = partial(self.server.deadlines.extend, self.connection)
        return environ


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    endpoint: _Endpoint

    def server_activate(self) -> None:
        super().server_activate()
        self.deadlines = _Deadlines()
        self.closing = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = self.socket.accept()
        context = self.endpoint.context
        if context is not None:
            sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def process_request(self, request: socket.socket, client_address: object) -> None:
        """Waits for a free handler slot (the connections behind it wait in the backlog)."""
        while not self._slots.acquire(timeout=ACCEPT_POLL_S):
            if self.closing.is_set():
                self.shutdown_request(request)
                return
        self.deadlines.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: socket.socket) -> None:
        self.deadlines.remove(request)
        self._slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up, is too slow or fails the TLS handshake is its own problem; anything
        else is one line on stderr, never a traceback, and the server goes on."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            print(f"optrace: warning: request failed: {type(error).__name__}: {printable(error)[:200]}",
                  file=sys.stderr, flush=True)


def _index_page(scheme: str) -> bytes:
    return (
        "<!DOCTYPE html><html><head><title>optrace exporter</title></head><body>"
        f"<h1>optrace {html.escape(__version__)}</h1>"
        "<p>Continuous CPU profile and uprobe call counts for Prometheus.</p>"
        f'<p><a href="/metrics">Metrics</a> ({scheme})</p>'
        f'<p><a href="{PROFILE_PATH}?seconds=30">CPU profile of the next 30 s</a> (pprof)</p></body></html>\n'
    ).encode()


class _GzipCache:
    """The gzip of the last page: a page is rendered once per drain, and compressed once too."""

    def __init__(self) -> None:
        self._last: tuple[bytes, bytes] | None = None

    def compress(self, page: bytes) -> bytes:
        last = self._last
        if last is not None and last[0] is page:
            return last[1]
        body = gzip.compress(page, compresslevel=1)  # level 1: 3 ms for 10k series, 9 costs 18
        self._last = (page, body)
        return body


def _profile_response(environ: dict, collect: ProfileCollector) -> tuple[str, list[tuple[str, str]], bytes]:
    """`/debug/pprof/profile?seconds=N`: blocks N seconds, then the pprof (see profilewindows)."""
    try:
        seconds = parse_seconds(parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True).get("seconds", []))
        extend = environ.get("optrace.extend_deadline")
        if extend is not None:
            extend(seconds + WAIT_SLACK_S + REQUEST_DEADLINE_S)
        body = collect(environ.get("REMOTE_ADDR", ""), seconds)
    except WindowRefused as refused:
        return refused.status, [("Content-Type", "text/plain; charset=utf-8")], f"{refused}\n".encode()
    return "200 OK", [("Content-Type", "application/octet-stream"), ("X-Content-Type-Options", "nosniff"),
                      ("Content-Disposition", 'attachment; filename="profile"')], body


def metrics_app(render: Callable[[], bytes], endpoint: Callable[[], _Endpoint],
                profile: ProfileCollector | None = None) -> Callable[[dict, StartResponse], Iterable[bytes]]:
    """The WSGI app: GET (and HEAD) `/metrics`, `/` and (with ``profile``) `/debug/pprof/profile`, 404
    elsewhere, 405 for any other method, 401 without valid credentials when the web config has users."""
    gzipped = _GzipCache()

    def respond(environ: dict, current: _Endpoint) -> tuple[str, list[tuple[str, str]], bytes]:
        if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
            return "405 Method Not Allowed", [("Allow", "GET, HEAD")], b""
        if not current.auth.allows(environ.get("HTTP_AUTHORIZATION")):
            return "401 Unauthorized", [("WWW-Authenticate", 'Basic realm="optrace"'),
                                        ("Content-Type", "text/plain")], b"Unauthorized\n"
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body, headers = render(), [("Content-Type", CONTENT_TYPE)]
            if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
                body = gzipped.compress(body)
                headers.append(("Content-Encoding", "gzip"))
            return "200 OK", headers, body
        if path == "/":
            return "200 OK", [("Content-Type", "text/html; charset=utf-8")], _index_page(current.scheme)
        if path == PROFILE_PATH and profile is not None:
            return _profile_response(environ, profile)
        return "404 Not Found", [("Content-Type", "text/plain")], b"not found: try /metrics\n"

    def app(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        current = endpoint()
        status, headers, body = respond(environ, current)
        start_response(status, [*headers, *current.headers, ("Content-Length", str(len(body)))])
        return [b"" if environ["REQUEST_METHOD"] == "HEAD" else body]

    return app


class MetricsServer:
    """Owns the listening socket and its serving threads; :meth:`close` stops them.

    The port is bound at construction (a busy port fails early, bad TLS files before it); requests
    are served from :meth:`start` on; :meth:`configure` applies a reloaded web config."""

    def __init__(self, address: ListenAddress, web: WebConfig | None = None) -> None:
        try:
            family = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)[0][0]
        except socket.gaierror as exc:
            raise OptraceError(f"cannot listen on {address}: {exc.strerror}") from None
        server_class = type("Server", (_Server,), {"address_family": family})
        endpoint = _endpoint(web or WebConfig())  # bad files fail before the port is taken
        try:
            self._httpd = make_server(address.host, address.port, None, server_class, handler_class=_QuietHandler)
        except OSError as exc:
            raise OptraceError(f"cannot listen on {address}: {exc.strerror}: choose another --listen") from None
        self._httpd.endpoint = endpoint
        self.address = ListenAddress(address.host, self._httpd.server_address[1])
        self._threads = [threading.Thread(target=self._httpd.serve_forever, name="optrace-http", daemon=True),
                         threading.Thread(target=self._httpd.deadlines.run, args=(self._httpd.closing,),
                                          name="optrace-http-deadlines", daemon=True)]

    @property
    def url(self) -> str:
        return f"{self._httpd.endpoint.scheme}://{self.address}/metrics"

    def configure(self, web: WebConfig) -> None:
        """Use ``web`` from the next request on (raises OptraceError, keeping the current one, if its
        TLS files cannot be used)."""
        self._httpd.endpoint = _endpoint(web)

    def start(self, render: Callable[[], bytes], profile: ProfileCollector | None = None) -> None:
        self._httpd.set_app(metrics_app(render, lambda: self._httpd.endpoint, profile))
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._httpd.closing.set()
        if self._threads[0].is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
