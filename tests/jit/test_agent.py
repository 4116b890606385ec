"""The agent API: what it writes reads back exactly (perf map and jitdump), from several threads, without
following planted files; and Debian's `perf inject --jit` accepts its jitdump."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading

import pytest
from hypothesis import given, settings, strategies as st

from jithelpers import PROGRAMS, PYTHON, needs_root
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.agent import AgentError, DebugLine, open_agent
from optrace.jitmaps.perfmap import read_perf_map


def read_back(agent):
    fd = os.open(agent.perf_map_path, os.O_RDONLY)
    entries, _ = read_perf_map(fd)
    os.close(fd)
    fd = os.open(agent.jitdump_path, os.O_RDONLY)
    header, records, _ = jd.read_jitdump(fd)
    os.close(fd)
    return entries, header, records


functions = st.lists(st.tuples(st.text(min_size=1, max_size=40), st.integers(1, 2**47),
                               st.binary(min_size=1, max_size=48)), max_size=15)


@settings(max_examples=40, deadline=None)
@given(functions)
def test_round_trip(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("agent")
    with open_agent(dump_dir=str(tmp), perf_map_dir=str(tmp)) as agent:
        for name, address, code in rows:
            agent.write_native_code(name, address, len(code), code)
    entries, header, records = read_back(agent)
    clean = [" ".join(name.replace("\0", " ").splitlines()).strip() or "[anonymous]" for name, _, _ in rows]
    assert header.pid == os.getpid() and header.monotonic
    assert [(e.start, e.size) for e in entries] == [(a, len(c)) for _, a, c in rows]
    loads = [r for r in records if isinstance(r, jd.CodeLoad)]
    assert [(r.code_addr, r.code) for r in loads] == [(a, c) for _, a, c in rows]
    assert [r.code_index for r in loads] == list(range(len(rows)))
    assert isinstance(records[-1], jd.CodeClose)
    assert [e.name for e in entries] == clean and [r.name for r in loads] == clean


def test_debug_info_precedes_its_code(tmp_path):
    with open_agent(dump_dir=str(tmp_path), perf_map_dir=str(tmp_path)) as agent:
        agent.write_debug_line_info(0x1000, [DebugLine(0x1000, 7, "gen.ll"), DebugLine(0x1008, 9, "gen.ll")])
        agent.write_native_code("f", 0x1000, 16)
        with pytest.raises(ValueError, match="already written"):
            agent.write_debug_line_info(0x1000, [])
        agent.unload_native_code(0x1000)
        with pytest.raises(ValueError):
            agent.unload_native_code(0x1000)
    _, _, records = read_back(agent)
    assert isinstance(records[0], jd.DebugInfo) and isinstance(records[1], jd.CodeLoad)
    assert [e.lineno for e in records[0].entries] == [7, 9]
    with pytest.raises(AgentError, match="closed"):
        agent.write_native_code("g", 0x2000, 1)


def test_threads_do_not_interleave_records(tmp_path):
    with open_agent(dump_dir=str(tmp_path), perf_map_dir=str(tmp_path)) as agent:
        def work(t):
            for i in range(300):
                agent.write_native_code(f"t{t}_f{i} " + "x" * 200, (t << 32) + i * 64, 64, bytes(64))
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    entries, _, records = read_back(agent)
    assert len(entries) == 1200
    assert sorted(r.code_index for r in records if isinstance(r, jd.CodeLoad)) == list(range(1200))


def test_planted_perf_map_is_not_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    os.symlink(target, tmp_path / f"perf-{os.getpid()}.map")
    with pytest.raises(AgentError):
        open_agent(dump_dir=str(tmp_path), perf_map_dir=str(tmp_path))
    assert target.read_text() == "keep me\n"


def test_dump_is_mapped_for_profilers_to_find(tmp_path):
    with open_agent(dump_dir=str(tmp_path), perf_map_dir=str(tmp_path)) as agent:
        with open("/proc/self/maps") as f:
            line = next(l for l in f if agent.jitdump_path in l)
        assert line.split()[1].startswith("r-x")


@pytest.mark.slow
def test_perf_inject_jit_accepts_the_dump(tmp_path):
    """perf record -k mono + perf inject --jit + perf report name the llvmlite-compiled function."""
    needs_root()
    if not shutil.which("perf"):
        pytest.skip("perf (linux-perf) is not installed")
    data, injected = tmp_path / "perf.data", tmp_path / "perf.jit.data"
    subprocess.run(["perf", "record", "-q", "-k", "mono", "-F", "999", "-o", str(data), PYTHON,
                    str(PROGRAMS / "llvm_jit.py"), "1.5", "--cpu", "--dump-dir", str(tmp_path), "--no-perf-map"],
                   check=True, capture_output=True, timeout=120)  # CPU seconds: Python's start is a fixed cost
    subprocess.run(["perf", "inject", "--jit", "-i", str(data), "-o", str(injected)], check=True,
                   capture_output=True, timeout=60)
    assert list(tmp_path.glob("jitted-*.so")), "perf inject wrote no ELF for the jitted code"
    report = subprocess.run(["perf", "report", "-i", str(injected), "--stdio", "--no-children", "--sort", "sym"],
                            check=True, capture_output=True, text=True, timeout=60).stdout
    share = next(float(l.split("%")[0]) for l in report.splitlines() if "optrace_jit_hot" in l)
    assert share > 50, report
