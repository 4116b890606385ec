"""A Record with known counts, built in code: the ground truth for the report tests.

demo (pid 100, threads 100 and 101): main -> hot_a (400), main -> hot_b (200), main -> lib_burn in libburn.so (200),
                main -> write -> ksys_write [k] (100)
bash (pid 200): main -> hot_a in /usr/bin/bash (50), a lost stack (50)
Total 1000 samples.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from optrace.model import Record
from optrace.recordfile import write_record

sys.path.insert(0, str(Path(__file__).parent))  # for `import profiletext` and `import synthetic`

from synthetic import BASH, DEMO, FRAMES, LIBBURN, LIBC, synthetic_record  # noqa: E402,F401


@pytest.fixture
def record() -> Record:
    return synthetic_record()


@pytest.fixture
def record_file(tmp_path: Path) -> Path:
    """The synthetic record (with call counts) written to a file in a world-readable tmp dir."""
    path = tmp_path / "optrace.data"
    write_record(synthetic_record(with_calls=True), path)
    return path
