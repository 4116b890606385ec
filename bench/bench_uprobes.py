"""Issue 4 benchmark: optrace's counting uprobe vs an empty BPF handler vs BCC's funccount vs no probe.

(a) Per-hit cost: the same workload (workloads/build/calls N: N calls of a noinline function) runs with
    no probe, with an empty BPF program on the uprobe (attached the way optrace attaches, in this
    process), under `optrace count`, and under BCC's funccount; cost per hit = (median CPU time of the
    workload (user+sys, wait4; the trap and the handler run in its context) - the same without a probe)
    / N. Configurations take turns, round after round. Other load on the machine shows in wall time
    far more than in the workload's own CPU time, so CPU time is the figure; wall time is kept too.
(b) Handler time alone: with kernel.bpf_stats_enabled=1 (restored afterwards), run_time_ns / run_cnt of
    each tool's kprobe-type programs from /proc/PID/fdinfo, over short runs of the same workload.
(c) Attach and detach of a 500-function glob (workloads/build/many: fn_000..fn_499): time from launch
    until the tool says it is counting, and from Ctrl-C until it has exited, for optrace and funccount.
Counts are checked against the workload's ground truth. Prints a markdown section on stdout, progress
on stderr, and writes bench/results/uprobes.json. Run as root:
    .venv/bin/python bench/bench_uprobes.py [--calls N] [--rounds R] [--glob-rounds G]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import OPTRACE, WORKLOADS, Launched, machine_info, md_table, median, write_results  # noqa: E402

BENCH_BUDGET_S = 420  # read by bench/run.py
FUNCCOUNT = "/usr/sbin/funccount-bpfcc"
CALLS = WORKLOADS / "calls"
MANY = WORKLOADS / "many"
GLOB_FUNCTIONS = 500


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Background(AbstractContextManager):
    """A counting tool running in the background, from 'attached' (its ready line) to Ctrl-C."""

    def __init__(self, argv: list[str], ready: str, ready_on_stderr: bool) -> None:
        self.argv, self.ready, self.ready_on_stderr = argv, ready, ready_on_stderr
        self.output = ""
        self.attach_s = self.detach_s = 0.0

    def __enter__(self) -> "Background":
        self.launched = Launched.start(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stream = self.launched.popen.stderr if self.ready_on_stderr else self.launched.popen.stdout
        line = stream.readline().decode()
        if self.ready not in line:
            raise RuntimeError(f"{self.argv[0]} did not start: {line}{stream.read().decode()[-2000:]}")
        self.attach_s = time.monotonic() - self.launched.started
        return self

    def __exit__(self, *exc: object) -> None:
        stopped = time.monotonic()
        self.launched.interrupt()
        out = self.launched.popen.stdout.read()  # until it exits; its stderr holds a line or two
        self.launched.finish(timeout_s=600)
        self.detach_s = time.monotonic() - stopped
        self.output = out.decode()


def optrace_count(spec: str) -> Background:
    return Background([str(OPTRACE), "count", spec, "--format", "json", "--max-probes", "1000"],
                      "Counting calls of", ready_on_stderr=True)


def funccount(spec: str) -> Background:
    return Background([FUNCCOUNT, spec], "Tracing", ready_on_stderr=False)


def empty_handler(spec: str) -> AbstractContextManager:
    """An empty BPF program on the same uprobe, attached by optrace's attacher (same attach path)."""
    from optrace.bpf.uprobes import BpfUprobeAttacher
    from optrace.frontend.uprobes.manager import ProbeManager
    from optrace.frontend.uprobes.counter import CallCounter

    return CallCounter([spec], manager=ProbeManager(lambda: BpfUprobeAttacher(handler="empty_handler")))


def optrace_calls(output: str) -> list[int]:
    return [row["calls"] for row in json.loads(output.strip().splitlines()[-1])["probes"]]


def funccount_calls(output: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^\S+\s+(\d+)$", output, re.MULTILINE)]


def run_workload(calls: int) -> tuple[float, float]:
    """(wall s, CPU s) of one run of the workload."""
    started = time.monotonic()
    proc = subprocess.Popen([str(CALLS), str(calls)], stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{CALLS} exited with {proc.returncode}")
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime


def kprobe_program_stats(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the kprobe-type BPF programs process `pid` holds."""
    seen, time_ns, count = set(), 0, 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            info = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                        if ":\t" in line)
        except OSError:
            continue
        if info.get("prog_type", "").strip() == "2" and info["prog_id"] not in seen:  # BPF_PROG_TYPE_KPROBE
            seen.add(info["prog_id"])
            time_ns += int(info.get("run_time_ns", 0))
            count += int(info.get("run_cnt", 0))
    return time_ns, count


class BpfStats(AbstractContextManager):
    """kernel.bpf_stats_enabled on for the block, then back to what it was."""

    PATH = Path("/proc/sys/kernel/bpf_stats_enabled")

    def __enter__(self) -> "BpfStats":
        self.previous = self.PATH.read_text().strip()
        self.PATH.write_text("1")
        return self

    def __exit__(self, *exc: object) -> None:
        self.PATH.write_text(self.previous)


def _setups(spec: str) -> dict[str, Callable[[], AbstractContextManager]]:
    return {
        "no probe": nullcontext,
        "empty BPF handler": lambda: empty_handler(spec),
        "optrace count": lambda: optrace_count(spec),
        "BCC funccount": lambda: funccount(spec),
    }


def _tool_pid(tool: object) -> int:
    return tool.launched.pid if isinstance(tool, Background) else os.getpid()


def per_hit(calls: int, rounds: int) -> dict:
    setups = _setups(f"{CALLS}:target")
    walls: dict[str, list[float]] = {name: [] for name in setups}
    cpus: dict[str, list[float]] = {name: [] for name in setups}
    counted: dict[str, list[int]] = {"optrace count": [], "BCC funccount": []}
    for round_ in range(rounds):
        for name, setup in setups.items():
            with setup() as tool:
                wall, cpu = run_workload(calls)
            walls[name].append(wall)
            cpus[name].append(cpu)
            if name == "optrace count":
                counted[name].append(optrace_calls(tool.output)[0])
            elif name == "BCC funccount":
                counted[name].append(funccount_calls(tool.output)[0])
            log(f"round {round_ + 1}/{rounds} {name}: wall {wall:.3f} s, workload CPU {cpu:.3f} s")
    base = median(cpus["no probe"])
    cost_us = {name: (median(c) - base) / calls * 1e6 for name, c in cpus.items()}
    return {
        "calls_per_run": calls, "rounds": rounds, "wall_s": walls, "cpu_s": cpus,
        "median_wall_s": {name: median(w) for name, w in walls.items()},
        "median_cpu_s": {name: median(c) for name, c in cpus.items()},
        "cost_per_hit_us": cost_us,
        "optrace_over_empty_percent": 100 * (cost_us["optrace count"] - cost_us["empty BPF handler"])
        / cost_us["empty BPF handler"],
        "counts_exact": {name: all(c == calls for c in values) for name, values in counted.items()},
        "counted": counted,
    }


def handler_time(calls: int, rounds: int) -> dict:
    setups = _setups(f"{CALLS}:target")
    del setups["no probe"]
    per_call: dict[str, list[float]] = {name: [] for name in setups}
    with BpfStats():
        for _round in range(rounds):
            for name, setup in setups.items():
                with setup() as tool:
                    before = kprobe_program_stats(_tool_pid(tool))
                    run_workload(calls)
                    after = kprobe_program_stats(_tool_pid(tool))
                runs = after[1] - before[1]
                if runs != calls:
                    raise RuntimeError(f"{name}: its programs ran {runs} times for {calls} calls")
                per_call[name].append((after[0] - before[0]) / runs)
                log(f"handler time {name}: {per_call[name][-1]:.0f} ns per call")
    return {"calls_per_run": calls, "rounds": rounds, "ns_per_call": per_call,
            "median_ns_per_call": {name: median(v) for name, v in per_call.items()}}


def glob_attach(rounds: int) -> dict:
    spec = f"{MANY}:fn_*"
    results: dict[str, dict] = {}
    for name, start, parse in (("optrace count", optrace_count, optrace_calls),
                               ("BCC funccount", funccount, funccount_calls)):
        attach, detach, exact = [], [], []
        for round_ in range(rounds if name == "optrace count" else 1):  # funccount detaches for ~1 min
            with start(spec) as tool:
                subprocess.run([str(MANY), "2"], check=True, stdout=subprocess.DEVNULL)
            counts = parse(tool.output)
            attach.append(tool.attach_s)
            detach.append(tool.detach_s)
            exact.append(len(counts) == GLOB_FUNCTIONS and set(counts) == {2})
            log(f"{name} 500-function glob: attached after {tool.attach_s:.2f} s, exited "
                f"{tool.detach_s:.2f} s after Ctrl-C, counts exact: {exact[-1]}")
        results[name] = {"attach_s": attach, "detach_s": detach, "counts_exact": all(exact),
                         "median_attach_s": median(attach), "median_detach_s": median(detach)}
    return results


def markdown(hits: dict, handlers: dict, glob: dict) -> str:
    rows = [(name, f"{hits['median_wall_s'][name]:.3f}", f"{hits['median_cpu_s'][name]:.3f}",
             "" if name == "no probe" else f"{hits['cost_per_hit_us'][name]:.2f}",
             "" if name == "no probe" else f"{handlers['median_ns_per_call'][name]:.0f}",
             hits["counts_exact"].get(name, ""))
            for name in hits["median_wall_s"]]
    glob_rows = [(name, f"{r['median_attach_s']:.2f}", f"{r['median_detach_s']:.2f}", len(r["attach_s"]),
                  r["counts_exact"]) for name, r in glob.items()]
    return "\n".join([
        "## Uprobe call counting (`optrace count`)",
        "",
        f"Per-hit cost: `workloads/build/calls {hits['calls_per_run']}` (that many calls of a noinline "
        f"function), median of {hits['rounds']} runs per configuration, configurations taking turns; cost "
        "per hit from the workload's CPU time (user+sys) minus the run without a probe. Handler time: "
        f"the BPF programs' own run_time_ns/run_cnt (kernel.bpf_stats_enabled), {handlers['rounds']} runs of "
        f"{handlers['calls_per_run']} calls.",
        "",
        md_table(("probe", "median wall s", "median workload CPU s", "cost per hit µs", "handler ns per call",
                  "counts exact"), rows),
        "",
        f"A hit with optrace's counting handler costs {hits['optrace_over_empty_percent']:+.1f}% over one with an "
        "empty BPF handler (target: at most +10%); the trap itself is most of either.",
        "",
        f"Attaching a {GLOB_FUNCTIONS}-function glob (`workloads/build/many:fn_*`), from launch to "
        "'counting', and from Ctrl-C to exit (every probe removed):",
        "",
        md_table(("tool", "attach s (median)", "detach s (median)", "runs", "counts exact"), glob_rows),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--handler-calls", type=int, default=30_000)
    parser.add_argument("--handler-rounds", type=int, default=3)
    parser.add_argument("--glob-rounds", type=int, default=3)
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", str(WORKLOADS.parent)], check=True)
    machine = machine_info()
    hits = per_hit(args.calls, args.rounds)
    handlers = handler_time(args.handler_calls, args.handler_rounds)
    glob = glob_attach(args.glob_rounds)
    text = markdown(hits, handlers, glob)
    write_results("uprobes", {"machine": machine, "per_hit": hits, "handler_time": handlers, "glob_500": glob,
                              "markdown": text})
    print(text)


if __name__ == "__main__":
    main()
