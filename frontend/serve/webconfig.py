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

from optrace.fileaccess import printable
from optrace.errors import OptraceError
from optrace.frontend.serve.settingsfile import read_settings, require_settings

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
# A bcrypt check costs 2**cost rounds: 0.13 s at cost 10 on the loaded 2-core test VM, 1.8 s at 14, 3.6 s at
# 15, 14 s at 17 (htpasswd's own limit: more than Prometheus' default 10 s scrape timeout) and days at 31.
# Every wrong password a client sends costs one check, one at a time: 14 keeps a check, and a scraper's
# first one behind the few let wait (MAX_PASSWORD_CHECKS), within that timeout on a slow machine.
MAX_BCRYPT_COST = 14
# What an unknown user's password is checked against, at the cost of a real user's hash, so "no such user"
# costs what "wrong password" does (hashes of random phrases, thrown away).
DECOY_HASHES = {
    4: b"$2b$04$iCxkW1mSUrxSblBVZqgN4.KtogPC1ICFkVrrmy8oHNWHtgoeppGp.",
    5: b"$2b$05$NbdOSsbyQne1DD8Tm9zkFe68yA75l1eG3n49F2GB/GhZ3n1MDPTD6",
    6: b"$2b$06$7rriPCIYpu0nOZ1RSHaJDeU64bn7mY7ZewnelKU8BrNchPYdU/w9.",
    7: b"$2b$07$EsAYtdGwykAbqycF.1jd4OgOF/6K6JSTEMBDAh4l8dBcjb6j62ikW",
    8: b"$2b$08$ajvirM5drxpAqki67jZ0uuNStuNMsz6wkL7eKHP3SmqioXwaWq41i",
    9: b"$2b$09$DSEIWjmB8Tx8d.p3zoEhGOxagyKPzu7gjXJxIjbuldBu/fEW/TMta",
    10: b"$2b$10$otFzaYDw8h9FK8oKTtqVtOCFM5MT0Utwn92DmtImRGD5HRkmon/4i",
    11: b"$2b$11$U/Z/NHiAWBD2AqkRZFR2OuN.sGU3oFQyChsGZvZAiWQIm2.RInNdK",
    12: b"$2b$12$kOuxiJiZ/JslMPu3io/reuIw9C35V8Rx4IBPaKL/ycwz0V6gGOFSO",
    13: b"$2b$13$194X5oTGdubjtw3xB7nTi.AJl0C6lEfroLP1gczVRMEEbPOZxqv7m",
    14: b"$2b$14$9NDxfBu1fnN3YQcSi6cReuvefkNRCuk7/qjUsCuyfBSXkKs9IXIHm",
}
AUTH_CACHE_SIZE = 256  # outcomes kept, for right and for wrong passwords each
MAX_PASSWORD_CHECKS = 4  # bcrypt checks running or waiting for their turn; more: 429 at once


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
    data = read_settings(path, "web config")
    try:
        settings = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise _fail(path, f"not valid YAML: {str(exc).splitlines()[0] if str(exc) else 'parse error'}") from None
    require_settings(settings, path, "web config", "leave out --web-config to serve plain HTTP without users")
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
        if _cost(hashed.encode()) > MAX_BCRYPT_COST:
            raise _fail(path, f"basic_auth_users: the hash of {name!r} has bcrypt cost {_cost(hashed.encode())}, over "
                              f"{MAX_BCRYPT_COST}: every wrong password would cost serve that much CPU; hash it again "
                              f"with a cost of 10 to {MAX_BCRYPT_COST}")
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


class AuthBusy(Exception):
    """MAX_PASSWORD_CHECKS bcrypt checks are already running or waiting: answer 429, not wait."""


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, as exporter-toolkit does, but
    without telling which users exist: an unknown user's password is checked against a decoy hash of
    the cost a real user's hash has (with users of several costs, one picked per name by a keyed hash,
    as often as users have it), so it takes the time a wrong password takes. One bcrypt at a time (~0.1 s
    of CPU at cost 10), at most MAX_PASSWORD_CHECKS running or waiting (a flood of wrong passwords gets
    429s, never every worker). Outcomes are cached, keyed by a SHA-256 of user, hash and password (no
    password is kept), right and wrong ones apart: a scraper that keeps sending the right password costs
    one bcrypt, and wrong guesses cannot push it out of the cache."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = users
        self._costs = sorted(_cost(hashed) for hashed in users.values())
        self._name_key = os.urandom(16)
        self._bcrypt_lock = threading.Lock()
        self._lock = threading.Lock()
        self._checks = 0  # running or waiting for the bcrypt lock
        self._outcomes: dict[bool, OrderedDict[bytes, None]] = {True: OrderedDict(), False: OrderedDict()}

    def allows(self, authorization: str | None, wait: bool = True) -> bool | None:
        """Raises AuthBusy when the check would have to wait behind too many others; without ``wait``,
        None when the outcome is not known without a bcrypt check."""
        if not self.users:
            return True
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        known = user in self.users
        hashed = self.users[user] if known else self._decoy(user)
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogateescape"), hashed, password))).digest()
        matches = self._cached(key)
        if matches is None:
            if not wait:
                return None
            matches = self._check(password, hashed)
            self._remember(key, matches)
        return known and matches

    def _decoy(self, user: str) -> bytes:
        digest = hashlib.blake2b(user.encode("utf-8", "surrogateescape"), key=self._name_key, digest_size=8).digest()
        return DECOY_HASHES[self._costs[int.from_bytes(digest, "little") % len(self._costs)]]

    def _cached(self, key: bytes) -> bool | None:
        with self._lock:
            for outcome, keys in self._outcomes.items():
                if key in keys:
                    keys.move_to_end(key)
                    return outcome
        return None

    def _remember(self, key: bytes, outcome: bool) -> None:
        with self._lock:
            keys = self._outcomes[outcome]
            keys[key] = None
            while len(keys) > AUTH_CACHE_SIZE:
                keys.popitem(last=False)

    def _check(self, password: bytes, hashed: bytes) -> bool:
        with self._lock:
            if self._checks >= MAX_PASSWORD_CHECKS:
                raise AuthBusy(f"{MAX_PASSWORD_CHECKS} password checks are already running or waiting: try again")
            self._checks += 1
        try:
            with self._bcrypt_lock:
                return _bcrypt_matches(password, hashed)
        finally:
            with self._lock:
                self._checks -= 1


def _cost(hashed: bytes) -> int:
    """The cost of a hash that BCRYPT_HASH matched ($2b$12$...)."""
    return int(hashed[4:6])


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
