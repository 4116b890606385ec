"""Shared helpers for the serve tests (as the `expo` fixture): scraping and parsing the exposition text."""
from __future__ import annotations

import gzip
import ssl
import urllib.request
from types import SimpleNamespace

import pytest

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, context: ssl.SSLContext | None = None, gzip_ok: bool = False, timeout: float = 10) -> str:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body.decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted label items: value} of every sample called ``name`` (e.g. optrace_cpu_samples_total)."""
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
