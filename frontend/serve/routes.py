"""What serve answers: `/metrics` (the page), `/` (a short HTML page pointing to it) and
`/debug/pprof/profile?seconds=N`, with what the web config asks for (basic auth, extra headers; TLS is
the server's, httpserver.py). A request comes in whole (its head read by the server); the answer is one
:class:`Response`. The server's event loop asks first for an answer that needs no waiting (the page of this
drain already rendered and compressed, a password already checked, an error): most answers are given
there, at once; the others (a page render, a bcrypt check, a profile's N seconds) are built on a worker
thread.
"""
from __future__ import annotations

import gzip
import html
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qs

from optrace import __version__
from optrace.frontend.serve.metricspage import CONTENT_TYPE
from optrace.frontend.serve.profilewindows import WindowRefused, parse_seconds
from optrace.frontend.serve.webconfig import AuthBusy, BasicAuth, WebConfig, tls_context

PROFILE_PATH = "/debug/pprof/profile"  # Go's net/http/pprof


class ProfileCollector(Protocol):
    """The profile windows (profilewindows.py)."""

    def collect(self, client: str, seconds: int) -> bytes:
        """Blocks ``seconds``, then the gzipped pprof; raises WindowRefused."""

    def refusal(self, client: str) -> WindowRefused | None:
        """Why a window for ``client`` would be refused now, without waiting; None if it might open."""


PageSource = Callable[[], bytes]  # renders /metrics (once per drain)
CurrentPage = Callable[[], bytes | None]  # the page of this drain if rendered already, without waiting
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # percent-decoded, without the query
    query: str
    client: str  # the peer's address: one profile collection at a time per client
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names; a repeated header: its last value


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes = b""


@dataclass(frozen=True)
class Endpoint:
    """What the web config makes of the endpoint, swapped whole when it is reloaded."""

    context: ssl.SSLContext | None
    auth: BasicAuth
    headers: list[tuple[str, str]]

    @property
    def scheme(self) -> str:
        return "https" if self.context else "http"


def endpoint_for(web: WebConfig) -> Endpoint:
    """Raises OptraceError (nothing changed) when the TLS files cannot be used."""
    return Endpoint(tls_context(web.tls) if web.tls else None, BasicAuth(web.users), list(web.headers.items()))


def text_response(status: int, reason: str, message: str, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, reason, [("Content-Type", TEXT), *(headers or [])], f"{message}\n".encode())


def index_page(scheme: str) -> bytes:
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

    def compress(self, page: bytes, wait: bool = True) -> bytes | None:
        """None without ``wait`` when ``page`` was not compressed yet."""
        last = self._last
        if last is not None and last[0] is page:
            return last[1]
        if not wait:
            return None
        body = gzip.compress(page, compresslevel=1)  # level 1: 3 ms for 10k series, 9 costs 18
        self._last = (page, body)
        return body


def _profile(request: Request, windows: ProfileCollector, wait: bool) -> Response | None:
    """`/debug/pprof/profile?seconds=N`: blocks N seconds, then the pprof (see profilewindows). Without
    ``wait``, only a refusal (a bad N, a client or server with its windows taken: a flood of those is
    answered by the event loop, never by the workers), else None."""
    try:
        seconds = parse_seconds(parse_qs(request.query, keep_blank_values=True).get("seconds", []))
        if not wait:
            refused = windows.refusal(request.client)
            if refused is None:
                return None
            raise refused
        body = windows.collect(request.client, seconds)
    except WindowRefused as refused:
        status, _, reason = refused.status.partition(" ")
        return text_response(int(status), reason, str(refused))
    return Response(200, "OK", [("Content-Type", "application/octet-stream"), ("X-Content-Type-Options", "nosniff"),
                                ("Content-Disposition", 'attachment; filename="profile"')], body)


class Routes:
    """GET (and HEAD) `/metrics`, `/` and (with ``profile``) `/debug/pprof/profile`, 404 elsewhere, 405 for
    any other method, 401 without valid credentials when the web config has users (429 while too many
    password checks wait, see BasicAuth). Every answer carries the web config's headers."""

    def __init__(self, render: PageSource, profile: ProfileCollector | None = None,
                 current: CurrentPage = lambda: None) -> None:
        self._render = render
        self._current = current
        self._profile = profile
        self._gzipped = _GzipCache()

    def respond(self, request: Request, endpoint: Endpoint, wait: bool = True) -> Response | None:
        """The answer, body included for HEAD too: the server sends its length, not the body. Without
        ``wait``, None when building it would wait (a render, a bcrypt check, a profile)."""
        answer = self._answer(request, endpoint, wait)
        if answer is None:
            return None
        return Response(answer.status, answer.reason, [*answer.headers, *endpoint.headers], answer.body)

    def _answer(self, request: Request, endpoint: Endpoint, wait: bool) -> Response | None:
        if request.method not in ("GET", "HEAD"):
            return Response(405, "Method Not Allowed", [("Allow", "GET, HEAD")])
        try:
            allowed = endpoint.auth.allows(request.headers.get("authorization"), wait)
        except AuthBusy as busy:
            return text_response(429, "Too Many Requests", str(busy), [("Retry-After", "1")])
        if allowed is None:
            return None
        if not allowed:
            return Response(401, "Unauthorized", [("WWW-Authenticate", 'Basic realm="optrace"'),
                                                  ("Content-Type", "text/plain")], b"Unauthorized\n")
        if request.path == "/metrics":
            return self._metrics(request, wait)
        if request.path == "/":
            return Response(200, "OK", [("Content-Type", "text/html; charset=utf-8")], index_page(endpoint.scheme))
        if request.path == PROFILE_PATH and self._profile is not None:
            return _profile(request, self._profile, wait)
        return Response(404, "Not Found", [("Content-Type", "text/plain")], b"not found: try /metrics\n")

    def _metrics(self, request: Request, wait: bool) -> Response | None:
        body, headers = self._render() if wait else self._current(), [("Content-Type", CONTENT_TYPE)]
        if body is not None and "gzip" in request.headers.get("accept-encoding", ""):
            body = self._gzipped.compress(body, wait)
            headers.append(("Content-Encoding", "gzip"))
        return None if body is None else Response(200, "OK", headers, body)
