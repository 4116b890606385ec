"""Benchmark of `optrace top` and `optrace annotate` next to `perf top` and `perf annotate`.

1. top: CPU use (% of one core) of `optrace top --stdio -a -F HZ -d 1` and `perf top --stdio -F HZ -d 1`
   (both whole machine, refreshed every second, output to /dev/null) at 99 and 999 Hz, while the demo
   workload keeps a core busy; each measured over a window after attach and warm-up, from the process
   tree's utime+stime in /proc. Tools and rates are interleaved, ROUNDS rounds; median and IQR.
2. annotate: wall time of `optrace annotate --stdio hot_a` on an optrace record of the demo and of
   `perf annotate --stdio hot_a` on a perf.data of the same workload (999 Hz, 2 s of CPU), interleaved.
3. record size: the demo's record (999 Hz, 3 s) with the kept code, and the same record written without it.

Run as root: `.venv/bin/python bench/bench_top_annotate.py`. Writes bench/results/top_annotate.json.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import OPTRACE, ROOT, WORKLOADS, Launched, md_table, median, quartiles, write_results  # noqa: E402

BENCH_BUDGET_S = 900  # read by bench/run.py
ROUNDS = 3
WARMUP_S = 4.0
WINDOW_S = 10.0
ANNOTATE_RUNS = 5
RATES = (99, 999)


def tree_cpu_s(pid: int) -> float:
    from benchlib import process_tree

    total = 0.0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def top_cpu(tool: str, hz: int) -> float:
    """% of one core over WINDOW_S, after the tool attached and WARMUP_S passed."""
    if tool == "optrace":
        argv = [OPTRACE, "top", "--stdio", "-a", "-F", str(hz), "-d", "1"]
    else:
        argv = ["perf", "top", "--stdio", "-F", str(hz), "-d", "1"]
    launched = Launched.start(argv, stdin=subprocess.PIPE)  # perf top spins on a closed stdin
    try:
        launched.wait_attached()
        time.sleep(WARMUP_S)
        cpu0, t0 = tree_cpu_s(launched.pid), time.monotonic()
        time.sleep(WINDOW_S)
        cpu, wall = tree_cpu_s(launched.pid) - cpu0, time.monotonic() - t0
    finally:
        launched.interrupt()
        launched.finish(timeout_s=60)
    return 100.0 * cpu / wall


def timed(argv: list) -> float:
    start = time.monotonic()
    subprocess.run([str(a) for a in argv], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def spread(values: list[float]) -> str:
    low_high = quartiles(values)
    return f"{median(values):.2f} (IQR {low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else f"{median(values):.2f}"


def main() -> None:
    demo = subprocess.Popen([str(WORKLOADS / "demo"), "100000"])
    try:
        top = {(tool, hz): [] for tool in ("optrace", "perf") for hz in RATES}
        for round_ in range(ROUNDS):
            for hz in RATES:
                for tool in ("optrace", "perf"):
                    top[tool, hz].append(top_cpu(tool, hz))
                    print(f"round {round_}: {tool} top {hz} Hz: {top[tool, hz][-1]:.1f}% of a core", file=sys.stderr)
    finally:
        demo.kill()
        demo.wait()
    with tempfile.TemporaryDirectory() as tmp:
        annotate, sizes = annotate_times(Path(tmp))
    results = {"top_cpu_percent": {f"{tool} {hz} Hz": values for (tool, hz), values in top.items()},
               "annotate_s": annotate, "record_bytes": sizes}
    write_results("top_annotate", results)
    print(markdown(top, annotate, sizes))


def annotate_times(tmp: Path) -> tuple[dict[str, list[float]], dict[str, int]]:
    data, perf_data = tmp / "demo.data", tmp / "perf.data"
    subprocess.run([OPTRACE, "record", "-F", "999", "-o", data, "--", WORKLOADS / "demo", "2"], check=True,
                   stderr=subprocess.DEVNULL)
    subprocess.run(["perf", "record", "-q", "-F", "999", "-o", perf_data, "--", WORKLOADS / "demo", "2"],
                   check=True, stderr=subprocess.DEVNULL)
    times: dict[str, list[float]] = {"optrace annotate": [], "perf annotate": []}
    for _ in range(ANNOTATE_RUNS):
        times["optrace annotate"].append(timed([OPTRACE, "annotate", "-i", data, "--stdio", "hot_a"]))
        times["perf annotate"].append(timed(["perf", "annotate", "-i", perf_data, "--stdio", "hot_a"]))
    return times, record_sizes(tmp)


def record_sizes(tmp: Path) -> dict[str, int]:
    """The demo's record (499 Hz, 3 s: `make demo`'s) as written, and the same record without the code."""
    data = tmp / "make-demo.data"
    subprocess.run([OPTRACE, "record", "-F", "499", "-o", data, "--", WORKLOADS / "demo", "3"], check=True,
                   stderr=subprocess.DEVNULL)
    stripped = tmp / "stripped.data"
    script = ("import dataclasses, sys; from optrace.recordfile import read_record, write_record; "
              "r = read_record(sys.argv[1]); write_record(dataclasses.replace(r, functions=None), sys.argv[2])")
    subprocess.run([ROOT / ".venv" / "bin" / "python", "-c", script, data, stripped], check=True, cwd=tmp)
    return {"with code": data.stat().st_size, "without code": stripped.stat().st_size}


def markdown(top: dict, annotate: dict, sizes: dict) -> str:
    rows = [[f"{hz} Hz", spread(top["optrace", hz]), spread(top["perf", hz])] for hz in RATES]
    lines = ["## top and annotate (bench/bench_top_annotate.py)", "",
             f"Measured while other work ran on the machine (shared, 2 vCPUs). `top`: whole machine, refreshed "
             f"every second, plain output to a pipe, demo workload running; CPU of the tool's process tree over "
             f"{WINDOW_S:.0f} s after attach and {WARMUP_S:.0f} s of warm-up; {ROUNDS} interleaved rounds, median "
             f"(IQR).", "",
             md_table(["rate", "optrace top, % of a core", "perf top, % of a core"], rows), "",
             f"`annotate --stdio hot_a` on the demo recorded at 999 Hz for 2 s, {ANNOTATE_RUNS} interleaved runs, "
             f"seconds, median (IQR):", "",
             md_table(["tool", "wall s"], [[tool, spread(values)] for tool, values in annotate.items()]), "",
             f"Record size of `make demo`'s recording (499 Hz, 3 s): {sizes['with code']} bytes with the kept "
             f"code, {sizes['without code']} bytes for the same record without it "
             f"({sizes['with code'] / sizes['without code']:.2f}x).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
