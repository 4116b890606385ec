"""Issue 41 item 7 (3.15): optrace vs py-spy 0.4.3 vs the 3.15 standard library's sampler
(``python3.15 -m profiling.sampling``), on Debian sid's python3.15 run in a container root (bench/sidroot.py).

(a) shares: one workloads/pyground.py process; each tool in turn records it for WINDOW_S at HZ, from its
    launch to its stop between two marks (SIGUSR1: the workload's own account of its functions' CPU time
    over that time): each tool's inclusive share of the ground truth's functions against that design, and
    its samples per CPU-second of the target (its threads' on-CPU time, from schedstat);
(b) slowdown: a fixed-work job (workloads/pyfixed.py, 10 frames deep) alone and with each tool attached at
    HZ, interleaved pairs in a new random order each round (bench_python.py's job).

optrace and py-spy read the process from the host; the standard library's sampler must be the same minor
and reads /proc/PID/maps and the binary by the paths the process sees, so it runs in the target's mount
namespace and root (nsenter -m -r), CPU mode, all threads, collapsed output. Prints a markdown section on
stdout, progress on stderr, writes bench/results/python315.json. Run as root:
    .venv/bin/python bench/bench_python315.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_profile import TOOLS, Recording, Tool, _folded_samples  # noqa: E402
from bench_python import PY_SPY_TOOL, job, log, optrace_json, python_outcomes, spread, wait_walked  # noqa: E402
from benchlib import ROOT, first_in_line, md_table, median, source_state, write_results  # noqa: E402
from sidroot import in_container, sid_python  # noqa: E402

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "python")]
from groundtruth import DESIGNED, PYGROUND, design_between, inclusive, parse_folded  # noqa: E402

BENCH_BUDGET_S = 900
MINOR = "3.15"
HZ = 999
WINDOW_S = 20
SLOW_ROUNDS = 5
BINDS = [ROOT, Path("/tmp")]
FIRST_IN_LINE = ["setsid", "nice", "-n", "-20"]  # a tool at the target's priority (benchlib.first_in_line)


def python315() -> list[str]:
    return in_container([f"/usr/bin/python{MINOR}"], BINDS)


def _stdlib_argv(pid: int, hz: int, out: Path) -> list[str]:
    return ["nsenter", "-t", str(pid), "-m", "-r", "--", f"/usr/bin/python{MINOR}", "-m", "profiling.sampling",
            "attach", "-a", "--mode", "cpu", "-r", str(hz), "--collapsed", "-o", str(out), str(pid)]


def stdlib_folded(out: Path) -> str:
    """The sampler's collapsed stacks ("tid:N;file:qualname:line;... count") as optrace and py-spy name a
    frame ("qualname (file:line)")."""
    lines = []
    for line in out.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_frame(part) for part in stack.split(";")[1:]]
        lines.append(";".join(frames) + f" {count}")
    return "\n".join(lines)


def _frame(part: str) -> str:
    path, _, rest = part.partition(":")
    qualname, _, line = rest.rpartition(":")
    return f"{qualname} ({path}:{line})"


STDLIB_TOOL = Tool(
    name=f"python{MINOR} -m profiling.sampling attach -a --mode cpu",
    record_pid=_stdlib_argv,
    record_system=lambda hz, out: [],
    writes_stdout=False,
    stacks_text=stdlib_folded,
    report=None,
    report_shown="(collapsed stacks)",
    sample_count=_folded_samples,
)
SIDE_BY_SIDE = {"optrace": TOOLS["optrace"], "py-spy": PY_SPY_TOOL, "profiling.sampling": STDLIB_TOOL}


def on_cpu_ns(pid: int) -> int:
    """The process's threads' time on a CPU so far (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


# (a) shares --------------------------------------------------------------------------------------------------

def measure_shares(workdir: Path) -> dict:
    report = workdir / "shares.json"
    # first in line, as the tools (FIRST_IN_LINE): at nice -20 beside py-spy at 0 on a machine at load 25,
    # py-spy got 13 samples per CPU-second at 999 Hz; at the machine's priority the target got 7 % of a CPU
    work = subprocess.Popen([*python315(), str(PYGROUND), "--seconds", "900", "--report", str(report)],
                            preexec_fn=first_in_line)
    try:
        time.sleep(3)  # its two threads running
        results = {}
        for key in random.sample(list(SIDE_BY_SIDE), len(SIDE_BY_SIDE)):
            results[key] = _window(key, SIDE_BY_SIDE[key], work, report, workdir)
            log(f"shares {key}: {results[key]}")
        return results
    finally:
        work.kill()
        work.wait()


def _window(key: str, tool: Tool, work: subprocess.Popen, report: Path, workdir: Path) -> dict:
    """The tool's recording, from its launch to its stop, between two marks: its shares against the
    workload's own account of the same time (a tool's first moments, before it names frames, count)."""
    out = workdir / f"shares-{key.replace('.', '_')}.out"
    work.send_signal(signal.SIGUSR1)
    cpu_before = on_cpu_ns(work.pid)
    with Recording(tool, [*FIRST_IN_LINE, *tool.record_pid(work.pid, HZ, out)], out) as recording:
        if key == "optrace":  # its programs may be compiled first (a changed program: 10-20 s under load)
            wait_walked(recording.launched.pid, work.pid, True)
        time.sleep(WINDOW_S)
        run, _ = recording.stop()
    cpu_s = (on_cpu_ns(work.pid) - cpu_before) / 1e9
    work.send_signal(signal.SIGUSR1)
    time.sleep(0.5)  # the mark written
    stacks = parse_folded(tool.stacks_text(out))
    shares, samples = inclusive(stacks)
    walked, _ = inclusive([(frames, count) for frames, count in stacks if any(" (" in f for f in frames)])
    design = design_between(report)
    return {"shares": {name: round(shares[name], 1) for name in DESIGNED},
            "design": {name: round(design[name], 1) for name in DESIGNED},
            "off_points": {name: round(shares[name] - design[name], 1) for name in DESIGNED},
            # of the samples with Python frames (optrace's copied before the process's tables: issue 43)
            "off_points_with_python": {name: round(walked[name] - design[name], 1) for name in DESIGNED},
            "samples": samples, "target_cpu_s": round(cpu_s, 2), "window_s": WINDOW_S,
            "samples_per_cpu_s": round(samples / cpu_s, 1) if cpu_s else None, "tool_cpu_s": run.cpu_s,
            "python": python_outcomes(optrace_json(out)["meta"]) if key == "optrace" else None}


# (b) slowdown ------------------------------------------------------------------------------------------------

def measure_slowdown(rounds: int, workdir: Path) -> dict:
    pairs: dict[str, list[dict]] = {key: [] for key in SIDE_BY_SIDE}
    for round_ in range(rounds):
        for key in random.sample(list(pairs), len(pairs)):
            order = [None, SIDE_BY_SIDE[key]]
            random.shuffle(order)
            pair = {("profiled" if tool else "baseline"): job(tool, HZ, workdir, python=python315(), settle_s=8.0)
                    for tool in order}
            pairs[key].append(pair)
            log(f"slowdown {key} (round {round_ + 1}/{rounds}): {pair}")
    return {key: {"wall": [r["profiled"]["wall_s"] / r["baseline"]["wall_s"] - 1 for r in rows],
                  "cpu": [r["profiled"]["cpu_s"] / r["baseline"]["cpu_s"] - 1 for r in rows],
                  "samples": [r["profiled"]["samples"] for r in rows],
                  "profiled_cpu_s": [r["profiled"]["cpu_s"] for r in rows], "pairs": rows}
            for key, rows in pairs.items()}


# -- report ----------------------------------------------------------------------------------------------------

def markdown(res: dict) -> str:
    cfg = res["config"]
    out = [f"### Python {MINOR} side by side: optrace, py-spy, the standard library's sampler", "",
           f"{cfg['date']}, commit {cfg['command']} at {cfg['commit']}, load {cfg['load_at_start']} -> "
           f"{cfg.get('load_at_end', '?')}; Debian sid's python{MINOR} in a container root; {HZ} Hz each.", ""]
    shares = res.get("shares", {})
    if shares:
        rows = []
        for key, got in shares.items():
            if "shares" not in got:
                continue
            rows.append([key, *(f"{got['shares'][n]:.1f} ({got['off_points'][n]:+.1f})" for n in DESIGNED),
                         str(got["samples"]), f"{got['target_cpu_s']:.1f}",
                         f"{got['samples_per_cpu_s']:.0f}" if got.get("samples_per_cpu_s") else "n/a",
                         f"{max(got['off_points_with_python'].values(), key=abs):+.1f}"])
        out += ["Inclusive shares, % (points off the workload's own account over the window; last column: the "
                "largest off among the samples with Python frames):", "",
                md_table(["tool", *DESIGNED, "samples", "target CPU s", "samples per CPU-s", "with Python frames"],
                         rows), ""]
    slow = res.get("slowdown", {})
    if slow:
        rows = [[key, spread(got["wall"], "%", 100.0), spread(got["cpu"], "%", 100.0),
                 f"{median(got['samples']) or 0:.0f}"] for key, got in slow.items()]
        out += ["Slowdown of the fixed-work job (median, IQR; pairs interleaved):", "",
                md_table(["tool", "wall", "CPU", "samples"], rows), ""]
    for stage, error in res.get("errors", {}).items():
        out.append(f"- {stage}: failed: {error}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 slowdown rounds: a smoke run")
    args = parser.parse_args()
    if not sid_python(MINOR).exists():
        print(f"bench_python315: no python{MINOR} in the sid root (make setup makes it)", file=sys.stderr)
        return 1
    cfg = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": source_state(),
           "command": ".venv/bin/python bench/bench_python315.py" + (" --quick" if args.quick else ""),
           "load_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
           "slow_rounds": 2 if args.quick else SLOW_ROUNDS}
    res: dict = {"area": "python315", "config": cfg, "errors": {}}
    stages = {"shares": measure_shares, "slowdown": lambda w: measure_slowdown(cfg["slow_rounds"], w)}
    with tempfile.TemporaryDirectory(prefix="optrace-bench-python315-") as tmp:
        for stage, measure in stages.items():
            try:
                res[stage] = measure(Path(tmp))
            except Exception as exc:  # one failed stage must not hide the other's figures
                res["errors"][stage] = f"{type(exc).__name__}: {exc}"
            log(f"{stage}: {res['errors'].get(stage, 'done')}")
    cfg["load_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    write_results("python315", res)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
