"""Issue 3 benchmark: reading big perf maps and jitdumps (time, peak memory, incremental cost), side by side
with perf's handling of the same files.

Run: .venv/bin/python bench/bench_jit.py [--lines N] [--inject-records K]
Each optrace measurement runs in a fresh worker process so its peak RSS is its own; perf runs as a child
and its peak RSS comes from wait4(). Prints a markdown section and writes bench/results/jit.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT as REPO, run_timed, write_results  # noqa: E402

BENCH_BUDGET_S = 600
PYTHON = sys.executable
NS = 1_000_000_000


# -- inputs ----------------------------------------------------------------------------------------------
def v8_like_lines(count: int, seed: int, distinct: int = 50_000) -> list[str]:
    """Lines like V8's --perf-basic-prof: many re-JITs of a bounded set of functions, addresses reused."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        fn = rng.randrange(distinct)
        start = 0x7F0000000000 + rng.randrange(1 << 22) * 64
        name = f"JS:*fn{fn} /srv/app/module{fn % 300}.js:{fn % 997}:{fn % 80}"
        lines.append(f"{start:x} {rng.randrange(64, 4096):x} {name}\n")
    return lines


def write_perf_map(path: Path, count: int, seed: int = 1, extra: str = "") -> None:
    with open(path, "w") as f:
        for chunk in range(0, count, 100_000):
            f.writelines(v8_like_lines(min(100_000, count - chunk), seed + chunk))
        f.write(extra)


def write_jitdump(path: Path, count: int, pid: int = 4242, code_size: int = 16) -> None:
    from optrace.jitmaps import jitdump as jd

    rng = random.Random(7)
    with open(path, "wb") as f:
        f.write(jd.encode_header(pid, 62, NS))
        code = bytes(code_size)
        for i in range(count):
            fn = rng.randrange(50_000)
            start = 0x7F0000000000 + rng.randrange(1 << 22) * 64
            f.write(jd.encode_load(jd.CodeLoad(NS + i, pid, pid, start, start, code_size, i,
                                               f"JS:*fn{fn} /srv/app/module{fn % 300}.js:{fn % 997}", code)))


# -- workers (fresh processes) ---------------------------------------------------------------------------
def worker(kind: str, path: str, extra: str | None) -> dict:
    from optrace.jitmaps import jitdump as jd
    from optrace.jitmaps.perfmap import PerfMapReader
    from optrace.jitmaps.symtable import SymbolHistory

    table = SymbolHistory()
    result: dict = {}
    fd = os.open(path, os.O_RDONLY)
    started = time.perf_counter()
    if kind == "jitdump":
        reader = jd.JitDumpReader()
        for record in reader.read_new(fd, final=True):
            if isinstance(record, jd.CodeLoad):
                table.add_many(((record.code_addr, record.code_size, record.name),), path, record.timestamp / 1e9)
        result["records"] = reader.records
    else:
        reader = PerfMapReader()
        table.add_many(reader.read_new(fd), path, 1.0)
        result["lines"] = reader.lines
    result["read_s"] = time.perf_counter() - started
    if kind == "perfmap_incremental":
        with open(path, "ab") as f, open(extra, "rb") as more:
            new_bytes = f.write(more.read())
        started = time.perf_counter()
        table.add_many(reader.read_new(fd), path, 2.0)
        result.update(incremental_s=time.perf_counter() - started, new_bytes=new_bytes,
                      new_lines=reader.lines - result["lines"])
    os.close(fd)
    started = time.perf_counter()
    table.lookup(0x7F0000000000 + 64 * 1000 + 1, 3.0)
    result["index_s"] = time.perf_counter() - started
    result.update(entries=len(table), distinct_names=len(table.names), bytes=os.path.getsize(path),
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def run_worker(kind: str, path: Path, extra: Path | None = None) -> dict:
    out = subprocess.run([PYTHON, __file__, "--worker", kind, str(path), str(extra or "")], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


# -- perf side by side -----------------------------------------------------------------------------------
def perf_report_on_map(work: Path, lines: int) -> dict:
    """perf record the jitcode workload, swap its perf map for the big one, time `perf report`."""
    if not shutil.which("perf") or os.geteuid() != 0:
        return {"skipped": "needs root and perf"}
    subprocess.run(["make", "-s", "-C", str(REPO / "workloads")], check=True)
    before = set(glob.glob("/tmp/perf-*.map"))
    data = work / "perf.data"
    subprocess.run(["perf", "record", "-q", "-F", "999", "-o", str(data), str(REPO / "workloads/build/jitcode"), "1"],
                   check=True, capture_output=True)
    (own_map,) = set(glob.glob("/tmp/perf-*.map")) - before
    real_line = Path(own_map).read_text()
    write_perf_map(Path(own_map), lines, extra=real_line)  # the real entry last: perf must read it all
    try:
        with open(work / "report.txt", "w+") as out:
            run = run_timed(["perf", "report", "-i", str(data), "--stdio", "--sort", "sym"], stdout=out)
            out.seek(0)
            named = "jitcode::hot loop" in out.read()
        return {"seconds": run.wall_s, "peak_rss_mb": run.maxrss_kb / 1024, "named": named,
                "optrace_same_map": run_worker("perfmap", Path(own_map))}
    finally:
        os.unlink(own_map)


def perf_inject_on_dump(work: Path, records: int) -> dict:
    """perf record a real agent-API JIT, grow its dump to `records` loads, time `perf inject --jit`."""
    if not shutil.which("perf") or os.geteuid() != 0:
        return {"skipped": "needs root and perf"}
    dump_dir = work / "inject"
    dump_dir.mkdir()
    data = dump_dir / "perf.data"
    proc = subprocess.run(["perf", "record", "-q", "-k", "mono", "-F", "999", "-o", str(data), PYTHON,
                           str(REPO / "tests/jit/programs/llvm_jit.py"), "0.5", "--dump-dir", str(dump_dir),
                           "--no-perf-map"], check=True, capture_output=True, text=True)
    dump = Path(proc.stdout.split()[3])
    pid = int(dump.name[4:-5])
    original = dump.read_bytes()
    write_jitdump(dump, records, pid=pid)
    with open(dump, "ab") as f:
        f.write(original[40:])
    run = run_timed(["perf", "inject", "--jit", "-i", str(data), "-o", str(dump_dir / "out.data")])
    elfs = len(list(dump_dir.glob("jitted-*.so")))
    ours = run_worker("jitdump", dump)
    shutil.rmtree(dump_dir)
    return {"records": records, "seconds": run.wall_s, "peak_rss_mb": run.maxrss_kb / 1024, "elf_files": elfs,
            "perf_ok": run.returncode == 0, "optrace_same_dump": ours}


# -- main ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--inject-records", type=int, default=5_000)
    parser.add_argument("--worker", nargs=3)
    args = parser.parse_args()
    if args.worker:
        kind, path, extra = args.worker
        print(json.dumps(worker(kind, path, extra or None)))
        return
    results: dict = {"lines": args.lines}
    with tempfile.TemporaryDirectory(prefix="bench-jit-") as tmp:
        work = Path(tmp)
        big = work / "perf-big.map"
        progress(f"writing a {args.lines:,}-line perf map")
        write_perf_map(big, args.lines)
        progress("optrace: full read of the perf map")
        results["perfmap_full"] = run_worker("perfmap", big)
        incremental = {}
        for share in (0.01, 0.1):
            progress(f"optrace: incremental read of {share:.0%} appended lines")
            base, extra = work / "base.map", work / "extra.map"
            write_perf_map(base, args.lines)
            write_perf_map(extra, int(args.lines * share), seed=99)
            incremental[str(share)] = run_worker("perfmap_incremental", base, extra)
        results["perfmap_incremental"] = incremental
        dump = work / "jit-4242.dump"
        write_jitdump(dump, args.lines)
        progress("optrace: full read of a jitdump with as many loads")
        results["jitdump_full"] = run_worker("jitdump", dump)
        dump.unlink()
        progress("perf report with the same perf map")
        results["perf_report_map"] = perf_report_on_map(work, args.lines)
        progress(f"perf inject --jit on a {args.inject_records:,}-load jitdump")
        results["perf_inject_dump"] = perf_inject_on_dump(work, args.inject_records)
    results["targets"] = targets(results)
    write_results("jit", results)
    print(markdown(results))


def progress(message: str) -> None:
    print(f"bench_jit: {message}", file=sys.stderr, flush=True)


def targets(r: dict) -> list[dict]:
    """Issue 3: incremental reads cost time in proportion to the new bytes; memory bounded by distinct
    symbols (here: peak RSS next to perf's for the same map)."""
    full = r["perfmap_full"]
    per_mb_full = full["read_s"] / (full["bytes"] / 1e6)
    rows = []
    for share, inc in r["perfmap_incremental"].items():
        per_mb = inc["incremental_s"] / (inc["new_bytes"] / 1e6)
        rows.append({"name": f"jit: incremental perf-map read, {float(share):.0%} appended",
                     "target": "per new MB <= 1.5x a full read's per MB",
                     "measured": f"{per_mb:.3f} s/MB vs {per_mb_full:.3f} s/MB", "met": per_mb <= 1.5 * per_mb_full})
    perf = r["perf_report_map"]
    if "seconds" in perf:
        ours = perf["optrace_same_map"]
        rows.append({"name": f"jit: peak RSS for a {r['lines']:,}-line perf map", "target": "<= 1.5x perf report's",
                     "measured": f"{ours['peak_rss_mb']:.0f} MB vs {perf['peak_rss_mb']:.0f} MB",
                     "met": ours["peak_rss_mb"] <= 1.5 * perf["peak_rss_mb"]})
    return rows


def _row(what: str, tool: str, read_s: float, index_s: float | None, rss_mb: float) -> str:
    index = "-" if index_s is None else f"{index_s:.3f} s"
    return f"| {what} | {tool} | {read_s:.3f} s | {index} | {rss_mb:.0f} MB |"


def markdown(r: dict) -> str:
    full, dump = r["perfmap_full"], r["jitdump_full"]
    rows = [
        "## JIT symbols (issue 3)",
        "",
        f"V8-like perf map of {r['lines']:,} lines ({full['bytes'] / 1e6:.0f} MB, {full['distinct_names']:,} distinct "
        f"names) and a jitdump with the same number of code loads ({dump['bytes'] / 1e6:.0f} MB, 16 code bytes each).",
        "",
        "| input | tool | read | index (first lookup) | peak RSS |",
        "|---|---|---:|---:|---:|",
        _row("perf map", "optrace", full["read_s"], full["index_s"], full["peak_rss_mb"]),
        _row("jitdump", "optrace", dump["read_s"], dump["index_s"], dump["peak_rss_mb"]),
    ]
    for key, what, tool, same_key in [
        ("perf_report_map", "same perf map + 1 s recording", "`perf report --stdio` (whole run)", "optrace_same_map"),
        ("perf_inject_dump", "jitdump, {records:,} loads", "`perf inject --jit` ({elf_files:,} ELF files)",
         "optrace_same_dump"),
    ]:
        perf = r[key]
        if "seconds" in perf:
            same = perf[same_key]
            rows.append(_row(what.format(**perf), tool.format(**perf), perf["seconds"], None, perf["peak_rss_mb"]))
            rows.append(_row("same file", "optrace", same["read_s"], same["index_s"], same["peak_rss_mb"]))
    rows += ["", "Incremental reads (map of the size above already read, then lines appended):", "",
             "| appended | new bytes | incremental read | per MB | full read per MB |", "|---:|---:|---:|---:|---:|"]
    per_mb_full = full["read_s"] / (full["bytes"] / 1e6)
    for share, inc in r["perfmap_incremental"].items():
        mb = inc["new_bytes"] / 1e6
        rows.append(f"| {float(share):.0%} ({inc['new_lines']:,} lines) | {mb:.1f} MB | {inc['incremental_s']:.3f} s | "
                    f"{inc['incremental_s'] / mb:.3f} s | {per_mb_full:.3f} s |")
    rows += ["", "Read: parse and store; index: the first lookup sorts the entries by address (once per map). "
             "perf report loads the whole map once, at report time; perf inject --jit writes one ELF per load."]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
