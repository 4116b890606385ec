"""Issue 42 benchmark: the whole machine recorded at 999 Hz while another user runs an exec storm.

Each round records 30 s of `-a -F 999` with every tool, in a shuffled order, over Debian's python3.11 (deep
recursion) and `xz -9` (no frame pointers) while the user `nobody` runs workloads/execstorm (20 x /bin/true,
then a fresh process that starts and joins 8 threads x 10, every 50 ms; issue 42's storm). Each tool's CPU
(user + system, its process and the children it waited for, from wait4) is compared with BCC's profile's in
the same round; optrace's completeness is its record's stack quality ("complete" share). With --before, a
second optrace (another worktree's, e.g. main's) is measured in the same rounds. Prints a markdown section,
progress on stderr, writes bench/results/storm.json. Run as root:
    .venv/bin/python bench/bench_storm.py [--rounds N] [--seconds S] [--before PATH/TO/optrace]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import OPTRACE, WORKLOADS, md_table, median, provenance, write_results  # noqa: E402

BENCH_BUDGET_S = 2400  # 3 rounds of 4 tools took 29 min at load 35
HZ = 999
PERF = "/usr/bin/perf"
BCC_PROFILE = "/usr/sbin/profile-bpfcc"
PYTHON = "/usr/bin/python3.11"  # Debian's: no frame pointers
RECURSION = ("import sys\nsys.setrecursionlimit(5000)\n"
             "def down(n):\n    return down(n - 1) if n else sum(range(20000))\n"
             "while True:\n    down(400)\n")
STORM_USER = "nobody"


def _tools(before: Path | None, seconds: int, out: Path) -> dict[str, list[str]]:
    tools = {"optrace": [str(OPTRACE), "record", "-a", "-F", str(HZ), "-d", str(seconds), "-o", str(out / "after")],
             "bcc": [BCC_PROFILE, "-af", "-F", str(HZ), str(seconds)],
             "perf": [PERF, "record", "-a", "-g", "-F", str(HZ), "-o", str(out / "perf.data"), "--", "sleep",
                      str(seconds)]}
    if before is not None:
        tools["optrace_before"] = [str(before), "record", "-a", "-F", str(HZ), "-d", str(seconds), "-o",
                                   str(out / "before")]
    return tools


def _cpu_of(argv: list[str]) -> tuple[float, float]:
    """(CPU seconds of the tool and the children it waited for, wall seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: exit {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, time.monotonic() - started


def _completeness(path: Path) -> float | None:
    from optrace.recordfile import read_record

    quality = read_record(path).meta.stack_quality or {}
    total = sum(quality.values())
    return 100.0 * quality.get("complete", 0) / total if total else None


def _load() -> list[subprocess.Popen]:
    storm = ["setpriv", "--reuid", STORM_USER, "--regid", "nogroup", "--clear-groups", "--",
             str(WORKLOADS / "execstorm"), "100000", "50", "20"]
    xz = ["sh", "-c", f"while :; do xz -9 -c {PYTHON} > /dev/null; done"]
    return [subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
            for argv in ([PYTHON, "-c", RECURSION], xz, storm)]


def measure(rounds: int, seconds: int, before: Path | None) -> dict:
    load = _load()
    rows: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="storm-warm-") as tmp:  # their BPF programs stored, not compiled
            for name, argv in _tools(before, 1, Path(tmp)).items():
                if name.startswith("optrace"):
                    _cpu_of(argv)
        for index in range(rounds):
            with tempfile.TemporaryDirectory(prefix="storm-") as tmp:
                tools = _tools(before, seconds, Path(tmp))
                order = random.sample(sorted(tools), len(tools))
                row: dict = {"round": index + 1, "order": order, "load": os.getloadavg()[0]}
                for name in order:
                    print(f"round {index + 1}: {name}", file=sys.stderr, flush=True)
                    row[name], _ = _cpu_of(tools[name])
                    if name.startswith("optrace"):
                        row[name + "_complete"] = _completeness(Path(tmp) / ("after" if name == "optrace"
                                                                              else "before"))
                rows.append(row)
                print(f"  {row}", file=sys.stderr, flush=True)
    finally:
        for proc in load:
            os.killpg(proc.pid, 9)
            proc.wait()
    return {"rows": rows, "seconds": seconds, "hz": HZ}


def _spread(values: list[float], spec: str = ".2f") -> str:
    return f"{median(values):{spec}} [{min(values):{spec}}..{max(values):{spec}}]" if values else "n/a"


def markdown(result: dict, command: str) -> str:
    rows = result["rows"]
    names = [n for n in ("optrace_before", "optrace", "bcc", "perf") if n in rows[0]]
    table = []
    for name in names:
        cpu = [r[name] for r in rows]
        ratio = [r[name] / r["bcc"] for r in rows]
        complete = [r[name + "_complete"] for r in rows if r.get(name + "_complete") is not None]
        table.append([name, _spread(cpu), _spread(ratio), f"{sum(x > 1 for x in ratio)}/{len(rows)}",
                      _spread(complete, ".1f") if complete else ""])
    loads = ", ".join(f"{r['load']:.1f}" for r in rows)
    return (f"## Whole machine at {result['hz']} Hz under another user's exec storm (issue 42)\n\n"
            f"{command}. {len(rows)} interleaved rounds of {result['seconds']} s each, load average at each round's "
            f"start {loads}. CPU seconds of each tool (median [min..max]), its ratio to BCC's profile in the same "
            f"round, rounds above BCC, and optrace's complete stacks (% of samples).\n\n"
            + md_table(["tool", "CPU s", "÷ BCC profile", "rounds > BCC", "complete %"], table) + "\n")


def targets(result: dict) -> list[dict]:
    rows = result["rows"]
    ratios = [r["optrace"] / r["bcc"] for r in rows]
    return [{"name": "storm: record -a -F 999 CPU under another user's exec storm",
             "target": "<= 1x BCC's profile in every round (issue 42)",
             "measured": f"{median(ratios):.2f}x median, {max(ratios):.2f}x worst of {len(rows)} rounds",
             "met": max(ratios) <= 1.0}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--before", type=Path, help="another optrace to measure in the same rounds (main's)")
    parser.add_argument("--from-results", type=Path, help="no run: the markdown of a results file written before")
    args = parser.parse_args()
    if args.from_results:
        result = json.loads(args.from_results.read_text())
    else:
        result = measure(args.rounds, args.seconds, args.before)
        result["provenance"] = provenance(sys.argv)
    result["targets"] = targets(result)
    write_results("storm", result)
    print(markdown(result, result["provenance"]))


if __name__ == "__main__":
    main()
