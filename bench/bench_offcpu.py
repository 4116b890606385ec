"""Issue 15 benchmark: the cost of `optrace record --off-cpu` on a context-switch-heavy workload.

workloads/build/pingpong: two threads pass a byte back and forth over two pipes (each round trip is two
blocking reads, about two context switches), at the issue's rate (work between the messages, calibrated so the
workload alone switches 100k times a second) and flat out, both pinned to CPU 0 (`taskset -c 0`): spread over this
machine's two vCPUs the same run took either ~0.5 s or 3-4 s depending on where the scheduler put the
threads (the workload alone: IQR 0.55-3.0 s over 7 runs), which buried the cost of a switch. The workload times itself (from its first write to the
join), so optrace's start-up and its final symbolization are outside the figure; under optrace the
command is held before exec until the programs are attached.

Modes, interleaved in random order in each round: the workload alone; `perf record -g` and `optrace
record` (CPU samples only, 99 Hz: what --off-cpu adds to); `optrace record --off-cpu`. Slowdown is the median of each mode's
elapsed time over the baseline's. BPF run time per event comes from the kernel's own accounting
(kernel.bpf_stats_enabled=1 during the run, read from the recording process's program fds in
/proc/PID/fdinfo: run_time_ns / run_cnt of its sched_switch program, which runs at every context switch
on the machine, the filtered-out ones too).

Reference tools, tried and reported as they behave here: `perf record --off-cpu` (needs a perf built
with BPF skeletons) and BCC's `offcputime-bpfcc` (needs kprobes). Run as root:
    .venv/bin/python bench/bench_offcpu.py [--rounds R] [--trips N]
"""
from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import OPTRACE, WORKLOADS, Launched, md_table, median, quartiles, write_results  # noqa: E402

BENCH_BUDGET_S = 540  # read by bench/run.py
PINGPONG = WORKLOADS / "pingpong"
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
TARGET_RATE = 100_000  # switches a second: issue 15's "<= 5 % slowdown at 100k switches/s"
EVERY = 32  # --off-cpu-every's value in the sampled modes
MODES = ("baseline", "perf_cpu", "optrace_cpu", "optrace_offcpu", "optrace_offcpu_user", "optrace_offcpu_every",
         "optrace_offcpu_user_every")
NAMES = {"baseline": "workload alone", "perf_cpu": "perf record -g (CPU, 99 Hz)", "optrace_cpu": "optrace record (CPU, 99 Hz)",
         "optrace_offcpu": "optrace record --off-cpu", "optrace_offcpu_user": "... --off-cpu --off-cpu-user-stacks",
         "optrace_offcpu_every": f"... --off-cpu --off-cpu-every {EVERY}",
         "optrace_offcpu_user_every": f"... --off-cpu --off-cpu-user-stacks --off-cpu-every {EVERY}"}
EXTRA_ARGS = {"optrace_offcpu": ["--off-cpu"], "optrace_offcpu_user": ["--off-cpu", "--off-cpu-user-stacks"],
              "optrace_offcpu_every": ["--off-cpu", "--off-cpu-every", str(EVERY)],
              "optrace_offcpu_user_every": ["--off-cpu", "--off-cpu-user-stacks", "--off-cpu-every", str(EVERY)]}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def argv_for(mode: str, trips: int, out: Path, work: int = 0) -> list[str]:
    workload = ["taskset", "-c", "0", str(PINGPONG), str(trips), str(work)]
    if mode == "baseline":
        return workload
    if mode == "perf_cpu":
        return ["perf", "record", "-q", "-e", "cpu-clock", "-F", "99", "-g", "-o", str(out), "--", *workload]
    return [str(OPTRACE), "record", *EXTRA_ARGS.get(mode, []), "-o", str(out), "--", *workload]


def prog_stats(pid: int) -> dict[int, tuple[int, int]]:
    """prog_id -> (run_time_ns, run_cnt) of the BPF programs the process holds."""
    stats = {}
    try:
        fdinfos = list(Path(f"/proc/{pid}/fdinfo").iterdir())
    except OSError:  # the process has exited
        return stats
    for fdinfo in fdinfos:
        try:
            text = fdinfo.read_text()
        except OSError:
            continue
        prog = re.search(r"^prog_id:\s*(\d+)", text, re.M)
        run_time = re.search(r"^run_time_ns:\s*(\d+)", text, re.M)
        run_cnt = re.search(r"^run_cnt:\s*(\d+)", text, re.M)
        if prog and run_time and run_cnt:
            stats[int(prog.group(1))] = (int(run_time.group(1)), int(run_cnt.group(1)))
    return stats


def run_once(mode: str, trips: int, workdir: Path, work: int = 0) -> dict:
    """One run: the workload's own elapsed time, and for --off-cpu the switch program's BPF stats."""
    launched = Launched.start(argv_for(mode, trips, workdir / f"{mode}.data", work), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    seen: dict[int, tuple[int, int]] = {}
    stop = threading.Event()

    def poll() -> None:  # the programs are gone once optrace exits: keep the last reading
        while not stop.wait(0.05):
            seen.update(prog_stats(launched.pid))

    poller = threading.Thread(target=poll, daemon=True)
    if mode.startswith("optrace_offcpu"):
        poller.start()
    stdout = launched.popen.stdout.read()
    run = launched.finish(300)
    stop.set()
    if poller.is_alive():
        poller.join()
    if run.returncode != 0:
        raise RuntimeError(f"{mode} exited with status {run.returncode}")
    elapsed, rate, cpu = stdout.split()[:3]
    result = {"elapsed_s": float(elapsed), "trips_per_s": float(rate), "cpu_s": float(cpu)}
    if seen:
        run_time, run_cnt = max(seen.values(), key=lambda pair: pair[1])  # the switch program runs most
        result.update(bpf_run_time_ns=run_time, bpf_run_cnt=run_cnt)
    return result


def try_reference(argv: list[str]) -> str:
    """How a reference tool behaves here: its first error line, or 'runs'."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"does not run: {exc}"
    text = (proc.stderr + proc.stdout).strip().splitlines()
    problem = next((line for line in reversed(text) if re.search(r"warn|error|fail|cannot|ignored", line, re.I)), "")
    return f"does not run here: {problem.strip()}" if proc.returncode or problem else "runs"


def spread(values: list[float], unit: str = "s", digits: int = 3) -> str:
    q = quartiles(values)
    text = f"{median(values):.{digits}f} {unit}"
    return f"{text} (IQR {q[0]:.{digits}f}-{q[1]:.{digits}f})" if q else text


def trip_seconds(work: int, trips: int = 20_000, repeats: int = 3) -> float:
    """The workload alone: median seconds per round trip with ``work`` steps per message."""
    times = []
    for _ in range(repeats):
        out = subprocess.run(["taskset", "-c", "0", str(PINGPONG), str(trips), str(work)], capture_output=True,
                             text=True, check=True).stdout
        times.append(float(out.split()[0]) / trips)
    return median(times)


def calibrated_work(switches_per_s: float) -> int:
    """The work per message at which the pair switches ``switches_per_s`` times a second (2 per round trip):
    a round trip costs t0 + k x work, measured at 0 and at a guess."""
    wanted = 2 / switches_per_s
    base, guess = trip_seconds(0), 3000
    per_step = (trip_seconds(guess) - base) / guess
    return max(0, round((wanted - base) / per_step)) if per_step > 0 else 0


def measure(rounds: int, trips: int, budget_s: float, work: int = 0) -> dict:
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    started = time.monotonic()
    old_stats = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        with tempfile.TemporaryDirectory(prefix="optrace-bench-offcpu-") as tmp:
            for index in range(rounds):
                order = random.sample(MODES, len(MODES))
                for mode in order:
                    runs[mode].append(run_once(mode, trips, Path(tmp), work))
                log(f"round {index + 1}/{rounds}: " + ", ".join(
                    f"{mode} {runs[mode][-1]['elapsed_s']:.3f} s" for mode in MODES))
                if time.monotonic() - started > budget_s:
                    log("time budget reached: fewer rounds")
                    break
    finally:
        STATS_SYSCTL.write_text(old_stats)
    return runs


def summarize(runs: dict[str, list[dict]], trips: int, work: int = 0) -> dict:
    base = median([r["elapsed_s"] for r in runs["baseline"]])
    base_cpu = median([r["cpu_s"] for r in runs["baseline"]])
    res: dict = {"trips": trips, "work": work, "rounds": len(runs["baseline"]), "modes": {}}
    for mode in MODES:
        elapsed = [r["elapsed_s"] for r in runs[mode]]
        cpu = [r["cpu_s"] for r in runs[mode]]
        entry = {"elapsed_s": elapsed, "median_s": median(elapsed), "cpu_s": cpu,
                 "slowdown_pct": 100 * (median(elapsed) / base - 1),
                 "cpu_slowdown_pct": 100 * (median(cpu) / base_cpu - 1),
                 "switches_per_s": 2 * trips / median(elapsed)}
        per_event = [r["bpf_run_time_ns"] / r["bpf_run_cnt"] for r in runs[mode] if r.get("bpf_run_cnt")]
        if per_event:
            entry["bpf_ns_per_call"] = per_event
            entry["bpf_calls"] = [r["bpf_run_cnt"] for r in runs[mode]]
            entry["bpf_ns_per_round_trip"] = [r["bpf_run_time_ns"] / trips for r in runs[mode] if r.get("bpf_run_cnt")]
        res["modes"][mode] = entry
    return res


def targets(res: dict) -> list[dict]:
    """At the issue's rate (TARGET_RATE switches a second, the workload given work between its messages).
    Met only when both the workload's elapsed time (what a user waits for) and its CPU time (what the
    machine pays: the BPF program runs in the workload's context) grew by at most 5 %; on a shared machine
    the elapsed time alone swung from -55 % to +9 % between runs, so it cannot pass a cost on its own."""
    at_rate = res["at_rate"]
    rate = at_rate["modes"]["baseline"]["switches_per_s"]
    out = []
    for mode in MODES[3:]:
        entry = at_rate["modes"][mode]
        out.append({"name": f"offcpu: slowdown of {NAMES[mode]} at {rate / 1000:.0f}k switches/s", "target": "<= 5%",
                    "measured": f"elapsed {entry['slowdown_pct']:+.1f}%, CPU {entry['cpu_slowdown_pct']:+.1f}%",
                    "met": max(entry["slowdown_pct"], entry["cpu_slowdown_pct"]) <= 5.0})
    return out


def mode_rows(res: dict) -> list[list[str]]:
    rows = []
    for mode in MODES:
        entry = res["modes"][mode]
        bpf = spread(entry["bpf_ns_per_call"], "ns", 0) if "bpf_ns_per_call" in entry else ""
        rows.append([NAMES[mode], spread(entry["elapsed_s"]), f"{entry['slowdown_pct']:+.1f}%",
                     spread(entry["cpu_s"]), f"{entry['cpu_slowdown_pct']:+.1f}%",
                     f"{entry['switches_per_s'] / 1000:.0f}k", bpf])
    return rows


def markdown(res: dict) -> str:
    header = ["mode", "elapsed", "slowdown", "CPU", "CPU slowdown", "switches/s", "BPF ns per call"]
    at_rate, flat_out = res["at_rate"], res["flat_out"]
    lines = [
        "## Off-CPU time: cost on a context-switch-heavy workload (issue 15)",
        "",
        "`taskset -c 0 workloads/build/pingpong TRIPS WORK`: two threads ping-pong a byte over two pipes,"
        " both on CPU 0 (spread over the two vCPUs, a run's time was bimodal: ~0.5 s or 3-4 s), each running"
        " WORK steps of an integer recurrence before each message; the modes in random order in each round;"
        " elapsed is the workload's own clock (median, IQR); switches/s = 2 per round trip. BPF ns per call:"
        " the kernel's run_time_ns / run_cnt (kernel.bpf_stats_enabled) of optrace's sched_switch program,"
        " which runs at every context switch on the machine (those it filters out too). 1-minute load average"
        f" at the end: {os.getloadavg()[0]:.1f}.",
        "",
        f"### (a) At the issue's rate: {TARGET_RATE // 1000}k switches/s (WORK = {at_rate['work']}, calibrated on the"
        f" workload alone; {at_rate['trips']} round trips, {at_rate['rounds']} rounds)",
        "",
        md_table(header, mode_rows(at_rate)),
        "",
        f"### (b) Flat out: no work between messages ({flat_out['trips']} round trips, {flat_out['rounds']} rounds)",
        "",
        md_table(header, mode_rows(flat_out)),
        "",
        "CPU is the workload's user + system time (getrusage), where the switch-out half of the BPF program"
        " runs. A recorded wait's BPF time splits (program variants, same workload, Dec 1): no stack 1.0 us"
        " (maps, two clock reads, comm), the user stack (frame pointers, bpf_get_stackid) 1.3 us more, the kernel"
        " stack (the ORC unwinder from the tracepoint) 2.5 us more: hence --off-cpu-user-stacks, and"
        f" --off-cpu-every {EVERY}, which takes stacks at one switch-out"
        f" in {EVERY} (at random) and counts that wait {EVERY} times: its BPF time per call is the filters' (the"
        " target lookup and the open-wait lookups at both ends of every switch) plus 1/32 of the stacks'."
        " perf record -g's row is the floor of any recorder whose events are bound to the workload's threads"
        " (the kernel switches them with the threads). The figures swing with the machine's load (elapsed more"
        " than CPU).",
        "",
        f"- `perf record --off-cpu`: {res['perf']}",
        f"- `offcputime-bpfcc`: {res['offcputime']}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trips", type=int, default=100_000, help="round trips flat out")
    parser.add_argument("--budget", type=float, default=BENCH_BUDGET_S - 60)
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", str(WORKLOADS.parent)], check=True)
    started = time.monotonic()
    work = calibrated_work(TARGET_RATE)
    trips_at_rate = TARGET_RATE // 2  # a second of the workload alone
    log(f"work per message for {TARGET_RATE} switches/s: {work}")
    at_rate = summarize(measure(args.rounds, trips_at_rate, args.budget / 2, work), trips_at_rate, work)
    left = args.budget - (time.monotonic() - started)
    flat_out = summarize(measure(args.rounds, args.trips, left - 40), args.trips)
    res = {"at_rate": at_rate, "flat_out": flat_out}
    res["perf"] = try_reference(["perf", "record", "--off-cpu", "-o", "/dev/null", "--", "true"])
    res["offcputime"] = try_reference(["offcputime-bpfcc", "1"])
    res["targets"] = targets(res)
    write_results("offcpu", res)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
