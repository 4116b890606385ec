"""Benchmark of the unwind tables (issue 10): time and peak memory to build the tables of Debian's
libpython3.11, libc.so.6 and gcc's cc1 from their .eh_frame, next to `readelf --debug-dump=frames-interp`
(binutils' decoder printing the same rows) and pyelftools (libc and libpython only: on cc1 it takes about
a minute), interleaved in one run; and the cached second lookup through UnwindTableCache.

Each build runs in a fresh driver process (no warm caches), timed inside it; peak memory is that
process's VmHWM minus its VmRSS just before the build (the rows, the section bytes and the decoder's
temporary lists). Run: `.venv/bin/python bench/bench_unwind.py`. Writes bench/results/unwind.json.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, md_table, median, quartiles, write_results  # noqa: E402

BENCH_BUDGET_S = 300
RUNS = 5
PYELFTOOLS_RUNS = 3
FILES = {"libpython3.11": "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
         "python3.11": "/usr/bin/python3.11",  # Debian links the interpreter in: the code a python3.11 runs
         "libc.so.6": os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6"),
         "cc1": "/usr/lib/gcc/x86_64-linux-gnu/12/cc1"}
PYELFTOOLS_FILES = ("libpython3.11", "libc.so.6")
PYTHON = ROOT / ".venv" / "bin" / "python"
CC1_TARGET_S = 2.0
CACHED_TARGET_S = 0.001

DRIVER = """
import json, sys, time
from optrace.frontend.symbols.access import FileRef
from optrace.frontend.unwind.cache import UnwindTableCache
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
path, tool = sys.argv[1], sys.argv[2]
before = status("VmRSS:")
t = time.perf_counter()
cpu = time.process_time()
if tool == "optrace":
    cache = UnwindTableCache()
    ref = FileRef(path, path)
    table = cache.of_ref(ref)
    build_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    cached = []
    for _ in range(50):
        t = time.perf_counter(); again = cache.of_ref(ref); cached.append(time.perf_counter() - t)
    assert again is table and cache.stats["conversions"] == 1
    result = {"rows": table.count, "bytes": table.nbytes, "unsupported": table.unsupported, "cached_s": sorted(cached)[25]}
else:
    from elftools.elf.elffile import ELFFile
    from elftools.dwarf.callframe import FDE
    rows = 0
    with open(path, "rb") as stream:
        for entry in ELFFile(stream).get_dwarf_info(follow_links=False).EH_CFI_entries():
            if isinstance(entry, FDE):
                rows += len(entry.get_decoded().table)
    build_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    result = {"rows": rows}
result.update(seconds=build_s, cpu_seconds=cpu_s, peak_bytes=status("VmHWM:") - before)
print(json.dumps(result))
"""


def run_driver(path: str, tool: str) -> dict:
    out = subprocess.run([str(PYTHON), "-c", DRIVER, path, tool], capture_output=True, text=True, check=True,
                         cwd=ROOT, timeout=200)
    return json.loads(out.stdout)


def run_readelf(path: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(["readelf", "--debug-dump=frames-interp", path], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=100)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": wall, "cpu_seconds": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    q = quartiles(values)
    return "" if q is None else f"{q[0] * scale:.{digits}f}-{q[1] * scale:.{digits}f}"


def main() -> int:
    load = Path("/proc/loadavg").read_text().split()[0]
    files = {name: path for name, path in FILES.items() if os.path.exists(path)}
    runs: dict[tuple[str, str], list[dict]] = {}
    for run in range(RUNS):  # interleaved: every tool and file in each round
        for name, path in files.items():
            print(f"round {run + 1}/{RUNS}: {name}", file=sys.stderr, flush=True)
            runs.setdefault((name, "optrace"), []).append(run_driver(path, "optrace"))
            runs.setdefault((name, "readelf"), []).append(run_readelf(path))
            if name in PYELFTOOLS_FILES and run < PYELFTOOLS_RUNS:
                runs.setdefault((name, "pyelftools"), []).append(run_driver(path, "pyelftools"))
    rows, targets, data = [], [], {}
    for (name, tool), results in runs.items():
        seconds = [r["seconds"] for r in results]
        cpu = [r["cpu_seconds"] for r in results]
        peaks = [r["peak_bytes"] for r in results if "peak_bytes" in r]
        first = results[0]
        rows.append([name, tool, f"{median(cpu):.3f}", spread(cpu, digits=3), f"{median(seconds):.3f}",
                     spread(seconds, digits=3), len(seconds),
                     f"{median(peaks) / 2**20:.1f}" if peaks else "", first.get("rows", ""),
                     f"{first['bytes'] / 2**20:.2f}" if "bytes" in first else ""])
        data[f"{name}/{tool}"] = results
    cached_rows = []
    for name in files:
        cached = [r["cached_s"] for r in runs[(name, "optrace")]]
        cached_rows.append([name, f"{median(cached) * 1e6:.0f}", spread(cached, 1e6, 0)])
        targets.append({"name": f"cached second lookup, {name}", "target": f"< {CACHED_TARGET_S * 1e3:g} ms",
                        "measured": f"{median(cached) * 1e6:.0f} µs", "met": median(cached) < CACHED_TARGET_S})
    if "cc1" in files:
        cc1 = median([r["cpu_seconds"] for r in runs[("cc1", "optrace")]])
        wall = median([r["seconds"] for r in runs[("cc1", "optrace")]])
        targets.insert(0, {"name": "unwind table build, cc1 (CPU time)", "target": f"< {CC1_TARGET_S:g} s",
                           "measured": f"{cc1:.2f} s CPU ({wall:.2f} s wall at load {load})",
                           "met": cc1 < CC1_TARGET_S})
    write_results("unwind", {"runs": data, "targets": targets})
    print("## Unwind tables (issue 10)\n")
    print(f"Building the unwind table from `.eh_frame`, {RUNS} interleaved rounds (pyelftools: {PYELFTOOLS_RUNS}, "
          "libpython and libc only), each build in a fresh process; measured while other engineers' tests and "
          f"benchmarks ran on this shared 2-CPU VM (load average {load} at the start), which is why CPU "
          "time (what the build costs) is shown next to wall time (what it waited for the CPU too).\n")
    print(md_table(["file", "tool", "CPU s", "IQR", "wall s", "IQR", "runs", "peak MiB", "rows", "table MiB"], rows))
    print("\nCached second lookup (`UnwindTableCache.of_ref` of the same file again: open, fstat, hit; median "
          "of 50 per process, then median over the rounds):\n")
    print(md_table(["file", "median µs", "IQR µs"], cached_rows))
    print("\n`optrace` is `UnwindTableCache.of_ref` on a cold cache: open through the hostile-file rules, read "
          "`.eh_frame`, decode, assemble and pack the 16-byte rows. `readelf` prints the same rows as text "
          "(`--debug-dump=frames-interp`), so it is the natural native reference; `pyelftools` decodes every "
          "FDE's table (`get_decoded()`), the way the issue first proposed, and is why optrace has its own "
          "decoder (left out on cc1: one run outside this benchmark took 62.5 s wall, load unknown). Peak MiB: the driver's VmHWM minus its VmRSS before the build. rows: optrace's after "
          "merging identical neighbours and adding CFA_END rows at gaps; pyelftools' as decoded.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
