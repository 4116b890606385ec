"""jitdump clocks: the spec (and the JVM agent, and optrace's own agent) put the header and the records on
one clock; V8 writes its header in wall-clock microseconds and its records in CLOCK_MONOTONIC ns; with
JITDUMP_FLAGS_ARCH_TIMESTAMP both are TSC ticks. `jit show` never prints a negative or absurd age, and
`jit convert` never puts one into a symbol name."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from jithelpers import PROGRAMS, dump_bytes, load
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.agent import open_agent

NS = 1_000_000_000
CODE = b"\x90\x90\x90\xc3"
AGES = re.compile(r"^\s+(-?\d+(?:\.\d+)?)\s+(?:load|move|debug|unwind|close)", re.M)
NAMED_TIMES = re.compile(r"@(-?[\d.]+)(s|ticks)\.\.(-?[\d.]+)(s|ticks)")


def show(optrace, path: Path) -> tuple[str, list[float]]:
    out = optrace("jit", "show", str(path), check=True).stdout
    return out, [float(age) for age in AGES.findall(out)]


def convert_names(optrace, path: Path, tmp_path: Path) -> list[str]:
    elf = tmp_path / "out.elf"
    optrace("jit", "convert", str(path), "-o", str(elf), check=True)
    from elftools.elf.elffile import ELFFile

    with open(elf, "rb") as f:
        return [sym.name for sym in ELFFile(f).get_section_by_name(".symtab").iter_symbols() if sym.name]


def reusing_dump(header_ts: int, start: int) -> bytes:
    """A at 0.5 s after `start`, replaced by B at 1.5 s: A's name in an ELF carries its lifetime."""
    return dump_bytes([load(0x7F0000001000, 4, "A", start + NS // 2, 0, CODE),
                       load(0x7F0000001000, 4, "B", start + 3 * NS // 2, 1, CODE)], header_ts=header_ts)


def test_same_clock_header_is_the_origin(optrace, tmp_path):
    path = tmp_path / "jit-42.dump"
    path.write_bytes(reusing_dump(header_ts=10 * NS, start=10 * NS))
    out, ages = show(optrace, path)
    assert "CLOCK_MONOTONIC clock, 2 records" in out and ages == [0.5, 1.5]
    assert "A@0.500000s..1.500000s" in convert_names(optrace, path, tmp_path)


def test_v8_style_wall_clock_header(optrace, tmp_path):
    """V8's header: wall-clock µs (1.8e15), far after its records' monotonic ns: ages count from the
    first record, and the listing says why."""
    path = tmp_path / "jit-42.dump"
    path.write_bytes(reusing_dump(header_ts=int(time.time() * 1e6), start=10_000 * NS))
    out, ages = show(optrace, path)
    assert "times from the first record: the header's timestamp" in out
    assert "is wall-clock µs (V8 writes its header so)" in out
    assert ages == [0.0, 1.0]
    assert "A@0.000000s..1.000000s" in convert_names(optrace, path, tmp_path)


def test_records_before_the_header_are_never_negative(optrace, tmp_path):
    path = tmp_path / "jit-42.dump"
    path.write_bytes(reusing_dump(header_ts=50 * NS, start=10 * NS))  # a bad writer: header after records
    out, ages = show(optrace, path)
    assert "is not on its records' clock" in out and ages == [0.0, 1.0]


def test_arch_timestamp_flag_is_tsc_ticks(optrace, tmp_path):
    raw = bytearray(reusing_dump(header_ts=1000, start=1000))
    struct.pack_into("<Q", raw, 32, jd.FLAG_ARCH_TIMESTAMP)  # the header's flags
    path = tmp_path / "jit-42.dump"
    path.write_bytes(bytes(raw))
    out, ages = show(optrace, path)
    assert "TSC clock, 2 records" in out and "TIME(ticks)" in out
    assert ages == [NS // 2, 3 * NS // 2]
    assert f"A@{NS // 2}ticks..{3 * NS // 2}ticks" in convert_names(optrace, path, tmp_path)


def test_optrace_agent_dump(optrace, tmp_path):
    """The toy writer (optrace's agent API): header and records on CLOCK_MONOTONIC, header first."""
    with open_agent(dump_dir=str(tmp_path), perf_map_dir=str(tmp_path)) as agent:
        agent.write_native_code("first", 0x7F0000002000, 4, CODE)
        time.sleep(0.2)
        agent.write_native_code("second", 0x7F0000002000, 4, CODE)  # replaces first
    out, ages = show(optrace, Path(agent.jitdump_path))
    assert "CLOCK_MONOTONIC clock," in out and "times from the first record" not in out
    assert ages == sorted(ages) and 0 <= ages[0] < 1 and 0.2 <= ages[-1] < 5
    [name] = [n for n in convert_names(optrace, Path(agent.jitdump_path), tmp_path) if n.startswith("first@")]
    born, _, died, _ = NAMED_TIMES.search(name).groups()
    assert 0 <= float(born) < 1 and 0.2 <= float(died) - float(born) < 5


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_real_node_jitdump(optrace, tmp_path):
    """`node --perf-prof` (V8) writes jit-PID.dump with a wall-clock µs header: no negative ages, none
    longer than the run, in `jit show` or in `jit convert`'s symbol names."""
    started = time.monotonic()
    subprocess.run(["node", "--perf-prof", str(PROGRAMS / "hot.js"), "1"], cwd=tmp_path, check=True,
                   capture_output=True, timeout=120)
    run_s = time.monotonic() - started
    [dump] = tmp_path.glob("jit-*.dump")
    out, ages = show(optrace, dump)
    assert "wall-clock µs (V8 writes its header so)" in out
    assert len(ages) > 100 and min(ages) == 0.0 and 0 < max(ages) <= run_s
    timed = [NAMED_TIMES.search(name) for name in convert_names(optrace, dump, tmp_path)]
    for match in filter(None, timed):
        born, _, died, _ = match.groups()
        assert 0 <= float(born) <= float(died) <= run_s, match.group(0)
