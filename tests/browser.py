"""Headless Chromium for the tests of pages people look at (flame graphs): load a file, read back the DOM
after its scripts ran, take a screenshot. Debian's `chromium` (scripts/setup-system.sh installs it)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from support import IN_CI


def chromium() -> str:
    path = shutil.which("chromium")
    if not path:
        if IN_CI:
            pytest.fail("CI=true and chromium is missing: run make setup")
        pytest.skip("chromium is not installed (make setup installs it)")
    return path


def _run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """One headless run with its own profile folder (other runs may be going on at the same time)."""
    with tempfile.TemporaryDirectory(prefix="optrace-chromium-") as profile:
        argv = [chromium(), "--headless", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                f"--user-data-dir={profile}", *(["--no-sandbox"] if os.geteuid() == 0 else []), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def dump_dom(page: Path, fragment: str = "") -> str:
    """The DOM after the page's scripts ran (file:// URL, optional #fragment)."""
    proc = _run("--dump-dom", page.resolve().as_uri() + fragment)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 700, fragment: str = "") -> float:
    """Writes a PNG of the page; returns the wall seconds chromium took (start, load, draw, write)."""
    start = time.monotonic()
    proc = _run(f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri() + fragment)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    return time.monotonic() - start


@dataclass
class Page:
    body: dict[str, str]  # the <body>'s attributes (data-ready-ms ...)
    top: list[list[str]]  # the "Hottest functions" table's rows, cells as text
    match: str  # the search result line
    scripts: int  # <script> elements in the DOM
    matches: list[list[str]] = field(default_factory=list)  # the search's list of matching functions
    hidden: set[str] = field(default_factory=set)  # ids of elements with the hidden attribute


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = Page({}, [], "", 0)
        self._in: str | None = None
        self._table: str | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "hidden" in values and "id" in values:
            self.page.hidden.add(values["id"])
        if tag == "body":
            self.page.body = values
        elif tag == "script":
            self.page.scripts += 1
        elif tag == "table":
            self._table = values.get("id")
        elif tag == "tbody":
            self._in = "tbody"
        elif tag == "tr" and self._in == "tbody":
            self._row = []
        elif tag == "td" and self._row is not None:
            self._row.append("")
        elif tag == "span" and values.get("id") == "match":
            self._in = "match"

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._row is not None:
            (self.page.matches if self._table == "matchlist" else self.page.top).append(self._row)
            self._row = None
        elif tag in ("tbody", "span") and self._in in ("tbody", "match"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._row:
            self._row[-1] += data
        elif self._in == "match":
            self.page.match += data


def read_page(dom: str) -> Page:
    reader = _Reader()
    reader.feed(dom)
    return reader.page


def share(page: Page, symbol: str, column: int = 0) -> float:
    """A number from the page's table row of a function: column 0 is its total share ("40.00%"); in a
    differential graph 0, 1, 2 are base, new and delta."""
    cells = [row for row in page.top if row[3] == symbol]
    assert cells, f"{symbol} not in the page's table: {[row[3] for row in page.top]}"
    return float(re.sub("[%+]", "", cells[0][column]))
