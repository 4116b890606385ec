"""Fixtures of the Python-frame tests (tests/python/pythons.py names the interpreters)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # for `import pythons`
sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # for pythons' `import sidroot`
