"""`optrace serve`'s OTLP push settings, configured the OpenTelemetry way.

Each setting comes from the first of: a serve flag, the config file's key (flags win over the file, as for
every serve setting: frontend/serve/config.py), the profiles signal's environment variable, the generic
one, the default::

    flag / config key          environment (OTEL_EXPORTER_OTLP_PROFILES_* first, then OTEL_EXPORTER_OTLP_*)
    otlp_endpoint              OTEL_EXPORTER_OTLP_ENDPOINT          base URL: /v1development/profiles appended (http)
    otlp_profiles_endpoint     OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT the URL as it is (path "/" when it has none)
    otlp_protocol              ..._PROTOCOL                         grpc (the default) or http/protobuf
    otlp_headers               ..._HEADERS                          key1=value1,key2=value2 (values %-encoded)
    otlp_certificate           ..._CERTIFICATE                      CA file (PEM) to verify the server with
    otlp_client_key            ..._CLIENT_KEY                       mTLS: the client's key (PEM)
    otlp_client_certificate    ..._CLIENT_CERTIFICATE               mTLS: its certificate (PEM)
    otlp_insecure              ..._INSECURE                         gRPC without a scheme: no TLS (true/false)
    otlp_compression           ..._COMPRESSION                      gzip (the default) or none
    otlp_timeout               ..._TIMEOUT                          per request: seconds (flag, key); ms (env)
    service_name               OTEL_SERVICE_NAME
    resource_attributes        OTEL_RESOURCE_ATTRIBUTES             key1=value1,... added to every resource
    otlp_interval              (none)                               seconds per profile (default 5)
    otlp_queue_bytes           (none)                               bound of the queue (default 16 MiB)

Push is on when an endpoint is set anywhere. The endpoints follow the spec's rules together: the first
source that sets either decides, and in it the profiles endpoint beats the generic one (an
OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT is not used when a flag sets --otlp-endpoint). For http/protobuf
the generic endpoint is a base URL the signal's path is appended to; the profiles one is used as it is.
For gRPC an endpoint is ``http://HOST:PORT`` (no TLS), ``https://HOST:PORT`` (TLS) or ``HOST:PORT``
(TLS unless insecure), with no path. A URL without a port takes its scheme's (80, 443).

Every value is checked here: a malformed endpoint, header or attribute list, an unreadable certificate
is one OptraceError line before any BPF is loaded. Header values (tokens) are never repeated in errors.
"""
from __future__ import annotations

import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optrace.errors import OptraceError
from optrace.frontend.serve.settingsfile import read_settings

PROTOCOLS = ("grpc", "http/protobuf")
# The OTel eBPF profiler, OTLP's reference profiling agent, speaks only gRPC; the spec lets an exporter
# keep grpc as its default for such reasons (its default is http/protobuf).
DEFAULT_PROTOCOL = "grpc"
COMPRESSIONS = ("gzip", "none")
DEFAULT_COMPRESSION = "gzip"  # the OTel eBPF profiler compresses its requests with gzip
DEFAULT_TIMEOUT_S = 10.0  # the spec's OTEL_EXPORTER_OTLP_TIMEOUT default
# One profile per interval: the OTel eBPF profiler's reporter interval (its -reporter-interval, 5 s)
DEFAULT_INTERVAL_S = 5
MAX_INTERVAL_S = 3600
DEFAULT_QUEUE_BYTES = 16 << 20  # see frontend/serve/otlpqueue.py for why
MIN_QUEUE_BYTES = 64 << 10
MAX_QUEUE_BYTES = 1 << 30
PROFILES_PATH = "v1development/profiles"  # the OTLP/HTTP path of profiles (the collector's receiver's)
DEFAULT_PORTS = {"http": 80, "https": 443}
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP header name (RFC 9110 token)
ENV_PREFIX = "OTEL_EXPORTER_OTLP_"
ENV_PROFILES_PREFIX = "OTEL_EXPORTER_OTLP_PROFILES_"

# config key -> (its type, the environment variables' suffix after the prefixes, or None)
OTLP_SETTING_TYPES: dict[str, type] = {
    "otlp_endpoint": str,
    "otlp_profiles_endpoint": str,
    "otlp_protocol": str,
    "otlp_headers": str,
    "otlp_certificate": str,
    "otlp_client_key": str,
    "otlp_client_certificate": str,
    "otlp_insecure": bool,
    "otlp_compression": str,
    "otlp_timeout": int,
    "otlp_interval": int,
    "otlp_queue_bytes": int,
    "service_name": str,
    "resource_attributes": str,
}
ENV_SUFFIXES = {"otlp_protocol": "PROTOCOL", "otlp_headers": "HEADERS", "otlp_certificate": "CERTIFICATE",
                "otlp_client_key": "CLIENT_KEY", "otlp_client_certificate": "CLIENT_CERTIFICATE",
                "otlp_insecure": "INSECURE", "otlp_compression": "COMPRESSION", "otlp_timeout": "TIMEOUT"}


@dataclass(frozen=True)
class OtlpTls:
    """TLS of the connection: the CA to verify the server with (None: the system's), the client's pair."""

    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)  # setting -> where it was given


@dataclass(frozen=True)
class OtlpOptions:
    protocol: str
    endpoint: str  # as configured, for messages
    target: str  # gRPC: HOST:PORT; http/protobuf: the full URL
    tls: OtlpTls | None  # None: plain text
    headers: tuple[tuple[str, str], ...] = ()
    compression: str = DEFAULT_COMPRESSION
    timeout_s: float | None = DEFAULT_TIMEOUT_S  # None: no limit (a timeout of 0)
    interval_s: int = DEFAULT_INTERVAL_S
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    service_name: str = ""
    resource_attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _Value:
    value: Any
    source: str  # where it came from, for messages: "--otlp-headers", "OTEL_EXPORTER_OTLP_HEADERS"...


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


class _Sources:
    """Looks a setting up in the flags/config settings, then the environment."""

    def __init__(self, settings: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        self.settings = settings
        self.environ = environ

    def get(self, key: str, *env_names: str) -> _Value | None:
        if key in self.settings:
            return _Value(self.settings[key], flag_name(key))
        for name in env_names:
            if self.environ.get(name, "") != "":
                return _Value(self.environ[name], name)
        return None

    def exporter(self, key: str) -> _Value | None:
        suffix = ENV_SUFFIXES[key]
        return self.get(key, ENV_PROFILES_PREFIX + suffix, ENV_PREFIX + suffix)


def otlp_options(settings: Mapping[str, Any], environ: Mapping[str, str]) -> OtlpOptions | None:
    """The push settings, or None when no endpoint is set anywhere (push is off)."""
    sources = _Sources(settings, environ)
    endpoint = _endpoint(settings, environ)
    if endpoint is None:
        given = [flag_name(key) for key in settings if key in OTLP_SETTING_TYPES]
        if given:
            raise OptraceError(f"{given[0]} needs an OTLP endpoint: --otlp-endpoint URL or OTEL_EXPORTER_OTLP_ENDPOINT")
        return None
    protocol = _choice(sources.exporter("otlp_protocol"), PROTOCOLS, DEFAULT_PROTOCOL)
    insecure = _boolean(sources.exporter("otlp_insecure"))
    target, secure = (http_target if protocol != "grpc" else grpc_target)(endpoint)
    if protocol == "grpc" and secure is None:
        secure = not insecure
    tls = _tls(sources) if secure else None
    return OtlpOptions(
        protocol=protocol, endpoint=_shown_url(endpoint[0].value), target=target, tls=tls,
        headers=parse_pairs(sources.exporter("otlp_headers"), header=True),
        compression=_choice(sources.exporter("otlp_compression"), COMPRESSIONS, DEFAULT_COMPRESSION),
        timeout_s=_timeout(sources.exporter("otlp_timeout")),
        interval_s=_bounded(sources.get("otlp_interval"), DEFAULT_INTERVAL_S, 1, MAX_INTERVAL_S, "seconds"),
        queue_bytes=_bounded(sources.get("otlp_queue_bytes"), DEFAULT_QUEUE_BYTES, MIN_QUEUE_BYTES, MAX_QUEUE_BYTES,
                             "bytes"),
        service_name=_service_name(sources.get("service_name", "OTEL_SERVICE_NAME")),
        resource_attributes=parse_pairs(sources.get("resource_attributes", "OTEL_RESOURCE_ATTRIBUTES")),
    )


def _endpoint(settings: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[_Value, bool] | None:
    """(the endpoint, whether it is the profiles signal's own) from the first source that sets one."""
    for layer, names in ((settings, ("otlp_profiles_endpoint", "otlp_endpoint")),
                         (environ, (ENV_PROFILES_PREFIX + "ENDPOINT", ENV_PREFIX + "ENDPOINT"))):
        for name in names:
            if layer.get(name, "") != "":
                shown = flag_name(name) if layer is settings else name
                return _Value(layer[name], shown), name in ("otlp_profiles_endpoint", ENV_PROFILES_PREFIX + "ENDPOINT")
    return None


def _bad_endpoint(value: _Value, why: str) -> OptraceError:
    return OptraceError(f"bad {value.source} {_shown_url(value.value)!r}: {why}")


def _shown_url(text: str) -> str:
    """The endpoint for a message: without a user's password, cut short."""
    return re.sub(r"//[^/@]*@", "//...@", text)[:200]


def http_target(endpoint: tuple[_Value, bool]) -> tuple[str, bool]:
    """The URL to POST to, and whether it is TLS."""
    value, signal_specific = endpoint
    if urllib.parse.urlsplit(value.value.strip()).scheme not in DEFAULT_PORTS:
        raise _bad_endpoint(value, "an http:// or https:// URL")
    parts = _split(value, value.value.strip())
    path = parts.path or "/"
    if not signal_specific:
        path = (parts.path if parts.path.endswith("/") else parts.path + "/") + PROFILES_PATH
    url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    return url, parts.scheme == "https"


def grpc_target(endpoint: tuple[_Value, bool]) -> tuple[str, bool | None]:
    """HOST:PORT for grpc, and whether the scheme says TLS (None: no scheme, the insecure setting says)."""
    value = endpoint[0]
    text = value.value.strip()
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme and scheme not in DEFAULT_PORTS:
        raise _bad_endpoint(value, "HOST:PORT, http://HOST:PORT or https://HOST:PORT")
    parts = _split(value, text if scheme else "//" + text)
    if parts.path not in ("", "/") or parts.query:
        raise _bad_endpoint(value, "a gRPC endpoint has no path (for http/protobuf set OTEL_EXPORTER_OTLP_PROTOCOL)")
    if not scheme and parts.port is None:
        raise _bad_endpoint(value, "HOST:PORT, http://HOST:PORT or https://HOST:PORT")
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{host}:{parts.port or DEFAULT_PORTS[scheme]}", (scheme == "https") if scheme else None


def _split(value: _Value, text: str) -> urllib.parse.SplitResult:
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018  # a port out of range or not a number raises here
    except ValueError as exc:
        raise _bad_endpoint(value, str(exc)) from None
    if not parts.hostname:
        raise _bad_endpoint(value, "no host")
    if parts.username is not None:
        raise _bad_endpoint(value, "credentials go in OTEL_EXPORTER_OTLP_HEADERS, not in the URL")
    if any(not c.isprintable() or c.isspace() for c in text):
        raise _bad_endpoint(value, "spaces or control characters")
    return parts


def parse_pairs(value: _Value | None, header: bool = False) -> tuple[tuple[str, str], ...]:
    """``key1=value1,key2=value2`` (W3C baggage's list, values percent-encoded, no properties): headers
    (names are HTTP tokens, lower-cased as gRPC metadata wants them) or resource attributes."""
    if value is None:
        return ()
    if not isinstance(value.value, str):
        raise OptraceError(f"bad {value.source}: expected key1=value1,key2=value2")
    pairs = []
    for position, item in enumerate(value.value.split(","), 1):
        if not item.strip():
            continue
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or (header and not TOKEN.fullmatch(key)):
            raise OptraceError(f"bad {value.source}: entry {position} is not KEY=VALUE"
                               + (" with KEY a header name" if header and sep and key else ""))
        decoded = urllib.parse.unquote(text.strip(), errors="strict") if "%" in text else text.strip()
        if any(not c.isprintable() for c in decoded):
            raise OptraceError(f"bad {value.source}: the value of {key[:64]!r} has control characters")
        pairs.append((key.lower() if header else key, decoded))
    return tuple(pairs)


def _choice(value: _Value | None, choices: tuple[str, ...], default: str) -> str:
    if value is None:
        return default
    text = str(value.value).strip().lower()
    if text not in choices:
        raise OptraceError(f"bad {value.source} {str(value.value)[:40]!r}: expected {' or '.join(choices)}")
    return text


def _boolean(value: _Value | None) -> bool:
    if value is None or isinstance(value.value, bool):
        return bool(value and value.value)
    text = value.value.strip().lower()
    if text not in ("true", "false"):
        raise OptraceError(f"bad {value.source} {value.value[:40]!r}: expected true or false")
    return text == "true"


def _timeout(value: _Value | None) -> float | None:
    """Seconds from a flag or the config file; milliseconds from the environment (the spec's unit). 0: none."""
    if value is None:
        return DEFAULT_TIMEOUT_S
    from_env = isinstance(value.value, str)
    text = str(value.value).strip()
    if not text.isdigit():
        raise OptraceError(f"bad {value.source} {text[:40]!r}: a whole number of "
                           f"{'milliseconds' if from_env else 'seconds'} (0: no limit)")
    seconds = int(text) / 1000 if from_env else int(text)
    return seconds or None


def _bounded(value: _Value | None, default: int, low: int, high: int, unit: str) -> int:
    if value is None:
        return default
    if not low <= value.value <= high:
        raise OptraceError(f"bad {value.source} {value.value}: {low} to {high} {unit}")
    return value.value


def _service_name(value: _Value | None) -> str:
    if value is None:
        return ""
    if not value.value.strip() or any(not c.isprintable() for c in value.value):
        raise OptraceError(f"bad {value.source}: a printable name")
    return value.value.strip()


def _tls(sources: _Sources) -> OtlpTls:
    """The TLS files, each read now (readable, a PEM the ssl module takes) so a bad one fails at start."""
    found = {key: sources.exporter(key) for key in ("otlp_certificate", "otlp_client_key", "otlp_client_certificate")}
    key, cert = found["otlp_client_key"], found["otlp_client_certificate"]
    if (key is None) != (cert is None):
        given = key or cert
        raise OptraceError(f"{given.source} needs its pair: a client key and a client certificate (mTLS)")
    sources_of = {key: value.source for key, value in found.items() if value}
    tls = OtlpTls(*(str(v.value) if v else None for v in found.values()), sources=sources_of)
    tls_files(tls)
    return tls


def tls_files(tls: OtlpTls) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(CA, client key, client certificate) as PEM bytes, checked by the ssl module; OptraceError if unusable."""
    pems = tuple(read_pem(path, tls.sources.get(key, key)) if path else None for key, path in
                 (("otlp_certificate", tls.certificate), ("otlp_client_key", tls.client_key),
                  ("otlp_client_certificate", tls.client_certificate)))
    context = ssl.create_default_context()
    try:
        if pems[0]:
            context.load_verify_locations(cadata=pems[0].decode("ascii", "replace"))
        if tls.client_key and tls.client_certificate:
            context.load_cert_chain(tls.client_certificate, tls.client_key)
    except ssl.SSLError as exc:
        raise OptraceError(f"OTLP TLS files: {exc.reason or exc}") from None
    return pems


def read_pem(path: str, source: str) -> bytes:
    """A PEM file named by a setting, read as serve's settings files are (root's, in root's folders, bounded)."""
    return read_settings(path, source)
