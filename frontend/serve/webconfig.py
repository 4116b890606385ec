"""`--web-config FILE`: TLS and basic auth for the scrape endpoint, in the Prometheus exporter-toolkit
format (node_exporter's ``--web.config.file``), so one file and one set of bcrypt hashes serves both::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file's folder
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert (default)
      client_ca_file: clients-ca.crt
      min_version: TLS12               # TLS10 .. TLS13; max_version too
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hash (htpasswd -nBC 12 '' | tr -d ':\\n')

Settings optrace cannot honour exactly are refused with a clear line rather than ignored: inline
``cert``/``key``/``client_ca``, Go cipher-suite and curve names, ``client_allowed_sans``, ``rate_limit``,
and the client-auth types that ask for a certificate without verifying it (``RequestClientCert``,
``RequireAnyClientCert``). ``http2`` is accepted and has no effect (HTTP/1.1 only).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from optrace.fileaccess import FilePolicy, RefusedFile, printable, read_file
from optrace.errors import OptraceError

CONFIG_POLICY = FilePolicy(max_size=1 << 20, follow_symlinks=True)  # root's own file: symlinks are fine
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# The headers exporter-toolkit lets a web config set, with the values it allows (None: any value).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None, "Content-Security-Policy": None,
}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
            "prefer_server_cipher_suites"}
UNSUPPORTED_TLS_KEYS = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences", "client_allowed_sans"}
TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
# What an unknown user's password is checked against, so "no such user" costs what "wrong password" does.
DECOY_HASH = b"$2b$10$pKyjhDsqguz52Lb85.wbneuRvn/ReI0Q3SFjLI/QMUnMFsRyRFx/a"  # of a phrase nobody sends
AUTH_CACHE_SIZE = 256


@dataclass(frozen=True)
class TlsFiles:
    """HTTPS settings: from --tls-cert/--tls-key (the first two only) or a web config."""

    cert: str
    key: str
    client_auth: str = "NoClientCert"
    client_ca: str | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"


@dataclass(frozen=True)
class WebConfig:
    """What the endpoint enforces: TLS (None: plain HTTP), extra response headers, and the basic-auth
    users with their bcrypt hashes (empty: no authentication)."""

    tls: TlsFiles | None = None
    headers: dict[str, str] = field(default_factory=dict)
    users: dict[str, bytes] = field(default_factory=dict)


def load_web_config(path: str) -> WebConfig:
    """The web config in ``path``, every value checked (one OptraceError line for the first problem)."""
    settings = _read_yaml(path)
    _known_keys(settings, TOP_KEYS, set(), path, "")
    folder = Path(path).parent
    return WebConfig(tls=_tls_settings(_mapping(settings, "tls_server_config", path), folder, path),
                     headers=_headers(_mapping(settings, "http_server_config", path), path),
                     users=_users(_mapping(settings, "basic_auth_users", path), path))


def _fail(path: str, message: str) -> OptraceError:
    return OptraceError(f"web config {path}: {message}")


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        data = read_file(path, CONFIG_POLICY)
    except (OSError, RefusedFile) as exc:
        raise OptraceError(f"cannot read web config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if data is None:
        raise OptraceError(f"cannot read web config {path}: it does not exist")
    try:
        settings = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise _fail(path, f"not valid YAML: {str(exc).splitlines()[0] if str(exc) else 'parse error'}") from None
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise _fail(path, "expected a mapping at the top level")
    return settings


def _mapping(settings: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = settings.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, f"{key} must be a mapping")
    return value


def _known_keys(settings: dict[str, Any], known: set[str], unsupported: set[str], path: str, where: str) -> None:
    for key in settings:
        if key in unsupported:
            raise _fail(path, f"{where}{key} is not supported by optrace serve")
        if key not in known:
            raise _fail(path, f"unknown setting {where}{printable(key)!s} (known: {', '.join(sorted(known))})")


def _text(settings: dict[str, Any], key: str, path: str, where: str, default: str = "") -> str:
    value = settings.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _fail(path, f"{where}{key} must be a string, not {value!r}")
    return value


def _tls_settings(tls: dict[str, Any], folder: Path, path: str) -> TlsFiles | None:
    """None when no TLS setting is given (plain HTTP, as exporter-toolkit does)."""
    where = "tls_server_config."
    _known_keys(tls, TLS_KEYS, UNSUPPORTED_TLS_KEYS, path, where)
    if not any(tls.get(key) for key in ("cert_file", "key_file", "client_auth_type", "client_ca_file")):
        return None
    texts = {key: _text(tls, key, path, where) for key in TLS_KEYS - {"prefer_server_cipher_suites"}}
    for key in ("cert_file", "key_file"):
        if not texts[key]:
            raise _fail(path, f"{where}{key} is missing")
    client_auth = texts["client_auth_type"] or "NoClientCert"
    if client_auth in UNVERIFIED_CLIENT_AUTH:
        raise _fail(path, f"{where}client_auth_type {client_auth} asks for a client certificate without verifying "
                          "it: optrace supports NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert")
    if client_auth not in CLIENT_AUTH:
        raise _fail(path, f"{where}client_auth_type {printable(client_auth)!r} is not one of {', '.join(CLIENT_AUTH)}")
    if texts["client_ca_file"] and client_auth == "NoClientCert":
        raise _fail(path, f"{where}client_ca_file is set but client_auth_type is NoClientCert")
    if not texts["client_ca_file"] and client_auth != "NoClientCert":
        raise _fail(path, f"{where}client_auth_type {client_auth} needs client_ca_file")
    versions = [texts["min_version"] or "TLS12", texts["max_version"] or "TLS13"]
    for version in versions:
        if version not in TLS_VERSIONS:
            raise _fail(path, f"{where}unknown TLS version {printable(version)!r} (known: {', '.join(TLS_VERSIONS)})")
    if TLS_VERSIONS[versions[0]] > TLS_VERSIONS[versions[1]]:
        raise _fail(path, f"{where}min_version {versions[0]} is above max_version {versions[1]}")
    ca = texts["client_ca_file"]
    return TlsFiles(cert=str(folder / texts["cert_file"]), key=str(folder / texts["key_file"]),
                    client_auth=client_auth, client_ca=str(folder / ca) if ca else None,
                    min_version=versions[0], max_version=versions[1])


def _headers(http: dict[str, Any], path: str) -> dict[str, str]:
    _known_keys(http, {"headers", "http2"}, set(), path, "http_server_config.")
    headers = _mapping(http, "headers", path)
    for name, value in headers.items():
        if name not in HEADERS:
            raise _fail(path, f"HTTP header {printable(name)!r} can not be configured (allowed: {', '.join(HEADERS)})")
        allowed = HEADERS[name]
        if not isinstance(value, str) or (allowed and value not in allowed) or not value.isprintable():
            raise _fail(path, f"invalid value for header {name}: {value!r}"
                              + (f" (expected one of: {', '.join(allowed)})" if allowed else ""))
    return dict(headers)


def _users(users: dict[str, Any], path: str) -> dict[str, bytes]:
    checked = {}
    for name, hashed in users.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise _fail(path, f"basic_auth_users: bad user name {name!r} (a non-empty string without ':')")
        if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
            raise _fail(path, f"basic_auth_users: the password of {name!r} is not a bcrypt hash ($2b$COST$...)")
        checked[name] = hashed.encode()
    return checked


def tls_context(tls: TlsFiles) -> ssl.SSLContext:
    """A server context for ``tls``; a file that cannot be used is one OptraceError line."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    context.options |= ssl.OP_NO_RENEGOTIATION  # TLS 1.2 renegotiation: a client-driven CPU cost, never needed
    for name in (tls.cert, tls.key) + ((tls.client_ca,) if tls.client_ca else ()):
        if not os.access(name, os.R_OK):
            raise OptraceError(f"cannot read TLS file {name}: it does not exist or is not readable")
    try:
        context.load_cert_chain(certfile=tls.cert, keyfile=tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise OptraceError(f"cannot use TLS certificate {tls.cert} with key {tls.key}: "
                           f"{exc.strerror or exc}") from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth]
    if tls.client_ca:
        try:
            context.load_verify_locations(cafile=tls.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise OptraceError(f"cannot use client CA file {tls.client_ca}: {exc.strerror or exc}") from None
    return context


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, as exporter-toolkit does: an
    unknown user is checked against a decoy hash (same cost as a wrong password, so timing does not
    tell which users exist); one bcrypt at a time (it costs ~0.1 s of CPU at cost 10); outcomes are
    cached, keyed by a SHA-256 of user, hash and password (no password is kept), so a scraper that
    keeps sending the right password costs one bcrypt, not one per scrape."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = users
        self._bcrypt_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[bytes, bool] = OrderedDict()

    def allows(self, authorization: str | None) -> bool:
        if not self.users:
            return True
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        known = user in self.users
        hashed = self.users[user] if known else DECOY_HASH
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogateescape"), hashed, password))).digest()
        with self._cache_lock:
            cached = self._cache.get(key)
        if cached is None:
            with self._bcrypt_lock:
                cached = _bcrypt_matches(password, hashed)
            with self._cache_lock:
                self._cache[key] = cached
                while len(self._cache) > AUTH_CACHE_SIZE:
                    self._cache.popitem(last=False)
        return known and cached


def _bcrypt_matches(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt 5 refuses passwords over 72 bytes: no such password can match
        return False


def _basic_credentials(authorization: str | None) -> tuple[str, bytes] | None:
    """(user, password) of a Basic Authorization header, None if absent or malformed."""
    scheme, _, encoded = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", "surrogateescape"), password
