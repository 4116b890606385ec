"""OTLP profiles receivers for the tests, on loopback: one built on the generated gRPC servicer of
opentelemetry-proto (ProfilesServiceServicer), one a small HTTP server for http/protobuf. Each keeps
every request it accepted, decoded by tests/otlpdecode.py, and can be told to fail (a status, a delay
to ask for) or be stopped and started again on the same port.

Importable by name (pytest's pythonpath includes tests/): tests/serve and tests/fleet use it, and the
fixtures at the end (``grpc_receiver``, ``http_receiver``) are imported by the test modules that want them.
"""
from __future__ import annotations

import gzip
import http.server
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest, ExportProfilesServiceResponse)

from otlpdecode import DecodedProfile, decode

PROFILES_PATH = "/v1development/profiles"


@dataclass
class Received:
    request: ExportProfilesServiceRequest
    headers: dict[str, str]
    size: int  # bytes of the request as it arrived (after decompression)
    at: float  # monotonic


@dataclass
class Failure:
    """What the receiver answers instead of accepting: a gRPC code name or an HTTP status, and the delay it
    asks for (RetryInfo, Retry-After) if any."""

    status: str | int
    delay_s: float | None = None


@dataclass
class Inbox:
    received: list[Received] = field(default_factory=list)
    refused_at: list[float] = field(default_factory=list)  # monotonic times of the requests refused
    failure: Failure | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # each request's profiles, decoded once (received only grows): a fleet's inbox holds whole-machine
    # profiles of three agents every 2 s, and a test module asks for them again and again
    _decoded: list[list[DecodedProfile]] = field(default_factory=list)
    _decoding: threading.Lock = field(default_factory=threading.Lock)

    def keep(self, request: ExportProfilesServiceRequest, headers: dict[str, str], size: int) -> None:
        with self.lock:
            self.received.append(Received(request, headers, size, time.monotonic()))

    def refuse(self) -> None:
        with self.lock:
            self.refused_at.append(time.monotonic())

    @property
    def refused(self) -> int:
        return len(self.refused_at)

    def profiles(self, **resource: object) -> list[DecodedProfile]:
        """Every profile received so far whose resource has these attributes (e.g. service_name=...: dots
        in keys are written as "__", e.g. optrace__agent="a2")."""
        with self.lock:
            requests = [r.request for r in self.received]
        with self._decoding:
            self._decoded.extend(decode(request) for request in requests[len(self._decoded):])
            decoded = self._decoded[:len(requests)]
        wanted = {key.replace("__", "."): value for key, value in resource.items()}
        return [p for profiles in decoded for p in profiles
                if all(p.resource.get(key) == value for key, value in wanted.items())]

    def count(self) -> int:
        with self.lock:
            return len(self.received)


class _Servicer(profiles_service_pb2_grpc.ProfilesServiceServicer):
    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def Export(self, request, context):  # noqa: N802  (the generated servicer's name)
        failure = self.inbox.failure
        if failure is not None:
            self.inbox.refuse()
            status = status_pb2.Status(code=grpc.StatusCode[failure.status].value[0], message="test receiver says no")
            if failure.delay_s is not None:
                info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=int(failure.delay_s),
                                                                       nanos=int(failure.delay_s % 1 * 1e9)))
                status.details.add().Pack(info)
            context.abort_with_status(_RpcStatus(grpc.StatusCode[failure.status], status))
        self.inbox.keep(request, dict(context.invocation_metadata()), request.ByteSize())
        return ExportProfilesServiceResponse()


class _RpcStatus(grpc.Status):
    """A status with a google.rpc.Status in its trailers, as grpcio-status's to_status makes it."""

    def __init__(self, code: grpc.StatusCode, status: status_pb2.Status) -> None:
        self.code = code
        self.details = status.message
        self.trailing_metadata = (("grpc-status-details-bin", status.SerializeToString()),)


class GrpcReceiver:
    """ProfilesService on HOST:PORT (port 0: a free one, kept across restarts)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.inbox = Inbox()
        self.host = host
        self.port = port
        self._server: grpc.Server | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        server = grpc.server(ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)])
        profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(_Servicer(self.inbox), server)
        self.port = server.add_insecure_port(f"{self.host}:{self.port}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(10)
            self._server = None


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    inbox: Inbox
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        failure = self.inbox.failure
        if self.path != PROFILES_PATH:
            self._answer(404, status_pb2.Status(message=f"no such path {self.path}").SerializeToString())
        elif failure is not None:
            self.inbox.refuse()
            headers = {"Retry-After": str(int(failure.delay_s))} if failure.delay_s is not None else {}
            self._answer(int(failure.status), status_pb2.Status(message="test receiver says no").SerializeToString(),
                         headers)
        else:
            self.inbox.keep(ExportProfilesServiceRequest.FromString(body), {k.lower(): v for k, v in self.headers.items()},
                            len(body))
            self._answer(200, ExportProfilesServiceResponse().SerializeToString())

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class HttpReceiver:
    """OTLP/HTTP (protobuf) on HOST:PORT, answering POSTs to /v1development/profiles."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.inbox = Inbox()
        handler = type("Handler", (_HttpHandler,), {"inbox": self.inbox})
        self._server = http.server.ThreadingHTTPServer((host, port), handler)
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def grpc_receiver():
    receiver = GrpcReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def http_receiver():
    receiver = HttpReceiver()
    yield receiver
    receiver.stop()
