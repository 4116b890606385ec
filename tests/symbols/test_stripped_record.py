"""Stripped code recorded for real (BPF, root) and reported by function: a -O2 binary whose hot static function
spreads over many addresses, and Debian's xz, whose liblzma has no symbols for its hot code. Ground truth:
the function's extent from nm on the unstripped build, and liblzma's FDEs as readelf decodes them."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
from bisect import bisect_right
from collections import Counter
from pathlib import Path

import pytest

from optrace.recordfile import read_record
from support import run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")
PROGRAM = Path(__file__).parent / "programs" / "stripped_hot.c"


def record(tmp_path: Path, *command: str) -> Path:
    out = tmp_path / "rec.data"
    proc = run_optrace("record", "-F", "999", "-o", str(out), "--", *command, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def report_rows(data: Path) -> list[dict]:
    return json.loads(run_optrace("report", "-i", str(data), "-f", "json", check=True).stdout)["rows"]


def leaf_hits(data: Path, dso_name: str) -> Counter[int]:
    """Samples by the file offset of their leaf frame, for leaves in the object called ``dso_name``."""
    rec = read_record(str(data))
    hits: Counter[int] = Counter()
    for sample in rec.samples:
        leaf = rec.frames[sample.frames[0]] if sample.frames else None
        if leaf is not None and not leaf.kernel and Path(leaf.dso).name == dso_name:
            hits[leaf.address] += sample.count
    return hits


def test_hot_static_function_of_a_stripped_binary_is_one_row(tmp_path: Path, elf) -> None:
    full, binary = tmp_path / "hot_full", tmp_path / "hot"
    subprocess.run(["gcc", "-O2", "-o", str(full), str(PROGRAM)], check=True, capture_output=True)
    shutil.copy(full, binary)
    subprocess.run(["strip", "--strip-all", str(binary)], check=True)
    name = next(line.split()[3] for line in subprocess.run(["nm", "-S", str(full)], capture_output=True, text=True,
                                                           check=True).stdout.splitlines() if " mix" in line)
    start, size = elf.symbol(full, name)
    first = elf.file_offset(binary, start)
    data = record(tmp_path, str(binary), "2")
    hits = leaf_hits(data, "hot")
    own = {offset: n for offset, n in hits.items() if first <= offset < first + size}
    assert len(own) >= 40, own  # spread: each address alone would be a row of 1-3 % of them
    rows = {row["symbol"]: row["samples"] for row in report_rows(data) if row["dso"].endswith("/hot")}
    assert rows.get(f"hot+{first:#x}", 0) >= 0.9 * sum(own.values()), (first, rows)


def lzma_input(path: Path, words: int = 500_000) -> Path:
    """About 2.5 MB of text from a 4,000-word vocabulary: xz -9 works on it for a few seconds."""
    vocabulary = [f"w{i:x}" for i in range(4000)]
    rng = random.Random(34)
    path.write_bytes(" ".join(rng.choice(vocabulary) for _ in range(words)).encode())
    return path


def test_xz_liblzma_hottest_function_is_one_row_with_its_code(tmp_path: Path, elf) -> None:
    """Debian's liblzma is stripped (.dynsym names its API only): its hottest function, by the FDE that holds
    the most leaf samples, is one row holding all of them, liblzma has as many rows as FDEs were hit, and
    annotate shows that function's instructions."""
    source = lzma_input(tmp_path / "input.txt")
    data = record(tmp_path, "xz", "-T1", "-9", "-k", "-f", str(source))
    lzma = next(Path(f.dso) for f in read_record(str(data)).frames if Path(f.dso).name.startswith("liblzma.so"))
    fdes = elf.fdes(lzma)
    starts = [elf.file_offset(lzma, start) for start, _ in fdes]
    by_fde: Counter[int] = Counter()
    for offset, n in leaf_hits(data, lzma.name).items():
        index = bisect_right(starts, offset) - 1
        assert index >= 0 and offset < starts[index] + fdes[index][1] - fdes[index][0], hex(offset)
        by_fde[starts[index]] += n
    hottest, samples = by_fde.most_common(1)[0]
    assert samples >= 300, by_fde
    rows = {row["symbol"]: row["samples"] for row in report_rows(data) if row["dso"] == str(lzma)}
    symbol = f"{lzma.name}+{hottest:#x}"
    assert rows[symbol] == samples and max(rows.values()) == samples
    assert len(rows) == len(by_fde), rows
    doc = json.loads(run_optrace("annotate", "-i", str(data), symbol, "-f", "json", check=True).stdout)
    instructions = doc["instructions"]
    assert doc["function"]["samples"] == samples and len(instructions) >= 20
    assert instructions[0]["address"] == fdes[starts.index(hottest)][0]
    assert sum(i["percent"] for i in instructions) == pytest.approx(100, abs=0.5)
