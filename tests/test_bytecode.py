"""`make setup` byte-compiles optrace's sources (the Makefile's bytecode step). The install is editable, so pip
compiles nothing, and where PYTHONDONTWRITEBYTECODE is set Python never writes the cache itself: every run
compiled all of optrace's modules from source again, 0.03-0.04 s of `record`'s imports before its first sample."""
from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

from support import REPO


def package_dirs() -> set[Path]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {REPO / path.split("/")[0] for path in config["tool"]["setuptools"]["package-dir"].values()}


def test_every_source_file_has_its_bytecode_cached():
    sources = [path for folder in package_dirs() for path in folder.rglob("*.py")]
    assert len(sources) > 50
    missing = [str(path.relative_to(REPO)) for path in sources
               if not Path(importlib.util.cache_from_source(str(path))).exists()]
    assert not missing, f"run make setup (bytecode): {missing[:5]}"
