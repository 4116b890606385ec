"""Shared helpers for the serve tests (as the `expo` fixture): scraping and parsing the exposition text."""
from __future__ import annotations

import gzip
import ssl
import subprocess
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from prometheus_client.parser import text_string_to_metric_families

from optrace.frontend.serve.webconfig import TlsFiles


def scrape(url: str, context: ssl.SSLContext | None = None, gzip_ok: bool = False, timeout: float = 10) -> str:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body.decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted label items: value} of every sample called ``name`` (e.g. optrace_cpu_seconds_total)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(v for key, v in samples(text, name).items() if set(labels.items()) <= set(key))


@pytest.fixture(scope="session")
def expo() -> SimpleNamespace:
    return SimpleNamespace(scrape=scrape, samples=samples, value=value)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def self_signed_cert(folder: Path, name: str = "server") -> TlsFiles:
    """A self-signed certificate for 127.0.0.1 made by openssl, and its key."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert))
    return TlsFiles(str(cert), str(key))


def client_cert(folder: Path, ca: TlsFiles, name: str) -> TlsFiles:
    """A client certificate signed by ``ca`` (a self-signed one used as a CA)."""
    cert, key, request = folder / f"{name}.pem", folder / f"{name}.key", folder / f"{name}.csr"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(request))
    openssl("x509", "-req", "-in", str(request), "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
            "-days", "1", "-out", str(cert))
    return TlsFiles(str(cert), str(key))


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory) -> TlsFiles:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def certs() -> SimpleNamespace:
    """openssl-made certificates: certs.self_signed(folder, name), certs.client(folder, ca, name)."""
    return SimpleNamespace(self_signed=self_signed_cert, client=client_cert)
