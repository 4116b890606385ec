"""Sending one OTLP profiles request, over gRPC or HTTP (protobuf), and what its answer means.

The answer is classified as the OTLP specification says (docs/specification.md of opentelemetry-proto):

- gRPC: OK is sent; CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE and DATA_LOSS are
  retryable; RESOURCE_EXHAUSTED only when the server adds a ``google.rpc.RetryInfo`` (it can recover);
  every other code is permanent. A RetryInfo's delay is the time to wait before the next try.
- HTTP: 200 is sent; 429, 502, 503 and 504 are retryable, with their ``Retry-After`` (seconds or a date)
  when they give one; a connection that fails or closes without an answer is retryable; every other
  status is permanent (its body, a ``google.rpc.Status``, says why).
- A success may carry a partial success: how many profiles the server rejected and why; not retried.

Both keep their connection between requests. Responses are read up to the spec's 4 MiB. The gRPC
channel's own reconnect backoff is capped at the sender's retry cap, so a backend that comes back is
found within one retry.

The timeout bounds the whole request, connecting and reading the answer included: gRPC's is the call's
deadline (DEADLINE_EXCEEDED, retryable); http.client's bounds each socket operation only (a receiver that
sent a byte every 2 s held the sender forever, issue 40), so the HTTP transport shuts its socket down once
the timeout has passed (:class:`_Deadline`), a retryable failure ("deadline").
"""
from __future__ import annotations

import email.utils
import gzip
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceResponse

from optrace import __version__
from optrace.escape import escape_controls
from optrace.frontend.serve.otlpconfig import OtlpOptions, tls_files

MAX_RESPONSE_BYTES = 4 << 20  # the spec's default limit of a response
MAX_MESSAGE_CHARS = 200  # of a server's error text in a warning
RETRY_CAP_S = 30.0  # the longest wait between two tries (frontend/serve/otlpexport.py)
USER_AGENT = f"optrace/{__version__}"
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRYABLE_GRPC = frozenset({"CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS"})
STATUS_DETAILS_KEY = "grpc-status-details-bin"
_EXPORT = profiles_service_pb2.DESCRIPTOR.services_by_name["ProfilesService"].methods_by_name["Export"]
EXPORT_METHOD = f"/{_EXPORT.containing_service.full_name}/{_EXPORT.name}"  # the generated stub's path


@dataclass(frozen=True)
class SendResult:
    ok: bool
    retryable: bool = False
    delay_s: float | None = None  # the server's own delay before the next try (RetryInfo, Retry-After)
    reason: str = ""  # gRPC code name, "http 503", "connection": the self-metrics' label
    message: str = ""  # the server's text (an error, a partial success), escaped and cut short
    rejected: int = 0  # profiles a partial success rejected


class Transport(Protocol):
    def send(self, body: bytes, timeout: float | None) -> SendResult: ...

    def close(self) -> None: ...


def make_transport(options: OtlpOptions) -> Transport:
    return GrpcTransport(options) if options.protocol == "grpc" else HttpTransport(options)


def shown(text: str) -> str:
    return escape_controls(text)[:MAX_MESSAGE_CHARS]


def answered(response: ExportProfilesServiceResponse) -> SendResult:
    partial = response.partial_success
    return SendResult(True, rejected=partial.rejected_profiles, message=shown(partial.error_message))


def retry_info_delay(status: status_pb2.Status) -> float | None:
    """The delay of a RetryInfo among a google.rpc.Status's details, if it has one."""
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return max(info.retry_delay.seconds + info.retry_delay.nanos / 1e9, 0.0)
    return None


def decoded_status(data: bytes) -> status_pb2.Status:
    try:
        return status_pb2.Status.FromString(data)
    except DecodeError:
        return status_pb2.Status()


class GrpcTransport:
    """OTLP/gRPC: the collector's ProfilesService/Export, the request's bytes sent as they are."""

    def __init__(self, options: OtlpOptions) -> None:
        import grpc  # ~20 MB of a library serve loads only to push over gRPC

        self._grpc = grpc
        channel_options = [("grpc.max_reconnect_backoff_ms", int(RETRY_CAP_S * 1000)),
                           ("grpc.initial_reconnect_backoff_ms", 1000),
                           ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
                           ("grpc.primary_user_agent", USER_AGENT)]
        if options.tls is None:
            self._channel = grpc.insecure_channel(options.target, channel_options)
        else:
            ca, key, cert = tls_files(options.tls)
            credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
            self._channel = grpc.secure_channel(options.target, credentials, channel_options)
        self._export = self._channel.unary_unary(EXPORT_METHOD, request_serializer=bytes,
                                                 response_deserializer=ExportProfilesServiceResponse.FromString)
        self._metadata = tuple(options.headers)
        self._compression = grpc.Compression.Gzip if options.compression == "gzip" else grpc.Compression.NoCompression

    def send(self, body: bytes, timeout: float | None) -> SendResult:
        try:
            response = self._export(body, timeout=timeout, metadata=self._metadata, compression=self._compression)
        except self._grpc.RpcError as error:
            return self._failed(error)
        return answered(response)

    def _failed(self, error) -> SendResult:
        code = error.code() if hasattr(error, "code") else None
        name = code.name if code is not None else "UNKNOWN"
        details = dict(error.trailing_metadata() or ()) if hasattr(error, "trailing_metadata") else {}
        delay = retry_info_delay(decoded_status(details.get(STATUS_DETAILS_KEY, b"")))
        retryable = name in RETRYABLE_GRPC or (name == "RESOURCE_EXHAUSTED" and delay is not None)
        return SendResult(False, retryable, delay, name, shown(error.details() or "") if hasattr(error, "details") else "")

    def close(self) -> None:
        self._channel.close()


class HttpTransport:
    """OTLP/HTTP with protobuf bodies: one kept-alive connection, POSTs to the profiles URL."""

    def __init__(self, options: OtlpOptions) -> None:
        url = urllib.parse.urlsplit(options.target)
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname or "", url.port or (443 if self._https else 80)
        self._path = urllib.parse.urlunsplit(("", "", url.path, url.query, ""))
        self._context = self._ssl_context(options) if self._https else None
        self._gzip = options.compression == "gzip"
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT,
                         **({"Content-Encoding": "gzip"} if self._gzip else {}), **dict(options.headers)}
        self._connection: http.client.HTTPConnection | None = None

    @staticmethod
    def _ssl_context(options: OtlpOptions) -> ssl.SSLContext:
        tls = options.tls
        ca = tls_files(tls)[0] if tls else None
        context = ssl.create_default_context(cadata=ca.decode("ascii", "replace") if ca else None)
        if tls and tls.client_key and tls.client_certificate:
            context.load_cert_chain(tls.client_certificate, tls.client_key)
        return context

    def send(self, body: bytes, timeout: float | None) -> SendResult:
        payload = gzip.compress(body, compresslevel=6, mtime=0) if self._gzip else body
        connection = self._connect(timeout)
        deadline = _Deadline(connection, timeout)
        try:
            with deadline:
                connection.request("POST", self._path, body=payload, headers=self._headers)
                response = connection.getresponse()
                data = response.read(MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            self.close()  # a new connection for the next try
            if deadline.expired:
                return SendResult(False, True, None, "deadline", f"no whole answer within {timeout:g} s")
            return SendResult(False, True, None, "connection", shown(str(exc) or type(exc).__name__))
        if deadline.expired or len(data) > MAX_RESPONSE_BYTES or response.getheader("Connection", "").lower() == "close":
            self.close()
        return self._answer(response.status, data, response.getheader("Retry-After"))

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._connection is None:
            if self._https:
                self._connection = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                               context=self._context)
            else:
                self._connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        self._connection.timeout = timeout
        if self._connection.sock is not None:
            self._connection.sock.settimeout(timeout)
        return self._connection

    @staticmethod
    def _answer(status: int, data: bytes, retry_after: str | None) -> SendResult:
        if status == 200:
            try:
                return answered(ExportProfilesServiceResponse.FromString(data[:MAX_RESPONSE_BYTES]))
            except DecodeError:
                return SendResult(True, message="the response was not an ExportProfilesServiceResponse")
        message = shown(decoded_status(data[:MAX_RESPONSE_BYTES]).message)
        if status in RETRYABLE_HTTP:
            return SendResult(False, True, retry_after_seconds(retry_after), f"http {status}", message)
        return SendResult(False, False, None, f"http {status}", message)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _Deadline:
    """Shuts ``connection``'s socket down once ``seconds`` have passed (None: never), however far its request
    got, until the block ends: whatever it was waiting for fails at once. A socket that is not there yet
    (being connected: bounded by the connection's own timeout) is shut down as soon as it is."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float | None) -> None:
        self.connection, self.seconds = connection, seconds
        self.expired = False
        self._done = threading.Event()

    def __enter__(self) -> _Deadline:
        if self.seconds is not None:
            threading.Thread(target=self._watch, name="otlp-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.expired = True
        while not self._done.is_set():
            sock = self.connection.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._done.wait(0.1)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's delay: seconds, or an HTTP date (None when absent or unreadable)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)
