"""Record JSON bounded before ``json.loads`` builds objects: the issue's 261 KB zip bomb of tiny lists, and
the tighter caps for a file owned by another user.

Figures behind the caps (recordfile.py's docstring): a 60 s system-wide record at 999 Hz on a busy 2-CPU
machine is 21.8 MB of JSON, 433k containers, 1.78M values; ``report`` of it peaks at 155 MB. Before the caps,
``report`` of the bomb below took 6.9 GB and 33 s; now it stops after inflating about 12 MB.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from optrace import recordfile
from optrace.model import Record, Sample
from optrace.recordfile import HEADER, MAGIC, FOREIGN_LIMITS, OWN_LIMITS, Limits, RecordFileError, read_record
from optrace.schema import encode_record
from support import OPTRACE

ROOT = os.geteuid() == 0
NOBODY = 65534


def streamed_file(path: Path, pieces: Iterator[bytes]) -> Path:
    """A record file around a payload given in pieces (never held whole: the bombs are 256 MiB)."""
    compressor = zlib.compressobj(9)
    parts, size = [], 0
    for piece in pieces:
        size += len(piece)
        parts.append(compressor.compress(piece))
    compressed = b"".join(parts) + compressor.flush()
    path.write_bytes(HEADER.pack(MAGIC, 1, zlib.crc32(compressed), len(compressed), size) + compressed)
    return path


def repeated(unit: bytes, last: bytes, total: int) -> Iterator[bytes]:
    """``[unit unit ... last]``, ``total`` bytes long, in 1 MiB pieces."""
    count = (total - 2 - len(last)) // len(unit)
    block = unit * ((1 << 20) // len(unit))
    yield b"["
    whole, rest = divmod(count, (1 << 20) // len(unit))
    for _ in range(whole):
        yield block
    yield unit * rest + last + b"]"


@pytest.fixture(scope="module")
def bomb_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bombs")


@pytest.mark.parametrize("unit,last,limit", [
    (b"[],", b"[]", "containers"),  # the file: 256 MiB of tiny lists, about 261 KB compressed
    (b"0,", b"0", "values"),
])
def test_tiny_element_bombs_stop_early(bomb_dir: Path, unit: bytes, last: bytes, limit: str) -> None:
    bomb = streamed_file(bomb_dir / f"bomb-{limit}.data", repeated(unit, last, OWN_LIMITS.payload_bytes - 64))
    assert 200_000 < bomb.stat().st_size < 300_000
    result, cpu_s, peak_kb = run_measured(bomb)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"over {OWN_LIMITS.containers} JSON containers or {OWN_LIMITS.values} values" in result.stderr
    assert cpu_s < 3.0, f"{cpu_s:.2f} s of CPU (was 52 s before the element caps; loose for a loaded machine)"
    assert peak_kb < 120 << 10, f"peak RSS {peak_kb >> 10} MB"


def run_measured(path: Path) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run report under GNU time: (result, CPU seconds, peak RSS in KB) of report alone (a child's own
    ru_maxrss starts from the forking parent's, which in a long pytest run is far larger)."""
    measured = path.with_suffix(".time")
    result = subprocess.run(["/usr/bin/time", "-o", str(measured), "-f", "%U %S %M", str(OPTRACE), "report", "-i",
                             str(path)], capture_output=True, text=True)
    user, system, peak_kb = measured.read_text().split()[-3:]
    return result, float(user) + float(system), int(peak_kb)


def record_with_samples(record: Record, count: int) -> Record:
    samples = [Sample(pid=1 + i, comm=f"c{i}", frames=(1, 0), count=1) for i in range(count)]
    return dataclasses.replace(record, samples=samples)


def counted(record: Record) -> tuple[int, int]:
    """(containers, values) of the record's JSON, counted the way the reader counts them."""
    text = json.dumps(encode_record(record), separators=(",", ":")).encode()
    containers = text.count(b"[") + text.count(b"{")
    return containers, containers + text.count(b",")


@pytest.fixture
def small_foreign_limits(monkeypatch, record: Record) -> Record:
    """Foreign caps shrunk below a 200-sample record (own caps untouched): returns that record."""
    big = record_with_samples(record, 200)
    containers, values = counted(big)
    monkeypatch.setattr(recordfile, "FOREIGN_LIMITS", Limits(1 << 20, containers - 1, values * 2))
    return big


def test_own_file_is_read_under_the_own_caps(tmp_path: Path, small_foreign_limits: Record) -> None:
    recordfile.write_record(small_foreign_limits, tmp_path / "own.data")
    assert len(read_record(tmp_path / "own.data").samples) == 200


@pytest.mark.skipif(not ROOT, reason="giving a file to another user needs root")
def test_another_users_file_is_held_to_the_foreign_caps(tmp_path: Path, small_foreign_limits: Record,
                                                         monkeypatch) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)
    path = tmp_path / "theirs.data"
    recordfile.write_record(small_foreign_limits, path)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(RecordFileError, match=rf"is owned by uid {NOBODY} and holds over \d+ JSON containers"
                                              r".*report a copy of it") as info:
        read_record(path)
    assert "\n" not in str(info.value)
    monkeypatch.setenv("SUDO_UID", str(NOBODY))  # root under sudo: the invoking user's file is their own
    assert len(read_record(path).samples) == 200


@pytest.mark.skipif(not ROOT, reason="giving a file to another user needs root")
def test_another_users_file_over_the_foreign_payload_cap(tmp_path: Path, record: Record, monkeypatch) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)
    path = tmp_path / "theirs.data"
    recordfile.write_record(record, path)
    os.chown(path, NOBODY, NOBODY)
    monkeypatch.setattr(recordfile, "FOREIGN_LIMITS", Limits(100, 10**6, 10**6))
    with pytest.raises(RecordFileError, match=rf"owned by uid {NOBODY} and holds a payload larger than 0 MiB"):
        read_record(path)


def test_foreign_caps_are_tighter_and_above_a_real_minute() -> None:
    """The measured 60 s, 999 Hz system-wide record (433k containers, 1.78M values, 21.8 MB) fits both."""
    for limits in (FOREIGN_LIMITS, OWN_LIMITS):
        assert limits.containers >= 2 * 433_000 and limits.values >= 2 * 1_780_000
        assert limits.payload_bytes >= 2 * 21_800_000
    assert FOREIGN_LIMITS.containers < OWN_LIMITS.containers and FOREIGN_LIMITS.values < OWN_LIMITS.values
