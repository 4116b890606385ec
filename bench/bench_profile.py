"""Issue 2 benchmark: optrace record vs `perf record -g` vs BCC's profile, side by side in one run.

(a) slowdown of a fixed-work target, (b) time to first sample, (c) peak RSS, (d) file size of a
system-wide run with a background load, (e) report time. Prints a markdown section on stdout,
progress on stderr, and writes bench/results/profile.json. Run as root:
    .venv/bin/python bench/bench_profile.py [--quick] [--pairs N] [--system-seconds S] [--tools optrace,perf,bcc]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (OPTRACE, WORKLOADS, Launched, ToolRun, md_table, median, quartiles,  # noqa: E402
                      run_timed, write_results)

BENCH_BUDGET_S = 540  # read by bench/run.py
FREQUENCIES = (99, 999)
WORK_ITERATIONS = 1_100_000_000  # about 1.5 s of CPU here
SLOT_MS = 25.0  # bench-phases slot width: the resolution of the time to first sample
PERF = "/usr/bin/perf"
BCC_PROFILE = "/usr/sbin/profile-bpfcc"
SLOT_NAME = re.compile(r"slot_(\d{3})")


@dataclass(frozen=True)
class Tool:
    """How one profiler is driven: per-process recording, whole-machine recording, reading its output."""

    name: str
    record_pid: Callable[[int, int, Path], list[str]]  # (pid, hz, out) -> argv
    record_system: Callable[[int, float, Path], list[str]]  # (hz, seconds, out) -> argv
    writes_stdout: bool  # the output file is the tool's stdout (BCC's profile -f)
    stacks_text: Callable[[Path], str]  # every sampled stack of a file, as text naming its functions
    report: list[str] | None  # argv prefix of its report command, the file path appended; None: no report step
    report_shown: str  # the report command as the README shows it
    sample_count: Callable[[str, Path], int | None]  # (stderr, out) -> samples in the file


def _stdout_of(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300).stdout


def _optrace_samples(stderr: str, out: Path) -> int | None:
    match = re.search(r"(\d+) samples", stderr)
    return int(match.group(1)) if match else None


def _perf_samples(stderr: str, out: Path) -> int | None:
    match = re.search(r"\((\d+) samples\)", stderr)
    return int(match.group(1)) if match else None


def _folded_samples(stderr: str, out: Path) -> int | None:
    total = 0
    for line in out.read_text(errors="replace").splitlines():
        count = line.rsplit(" ", 1)[-1]
        total += int(count) if count.isdigit() else 0
    return total


TOOLS = {
    "optrace": Tool(
        name="optrace record",
        record_pid=lambda pid, hz, out: [str(OPTRACE), "record", "-F", str(hz), "-g", "-p", str(pid), "-o", str(out)],
        record_system=lambda hz, secs, out: [str(OPTRACE), "record", "-a", "-F", str(hz), "-g", "-d", str(secs),
                                             "-o", str(out)],
        writes_stdout=False,
        stacks_text=lambda out: _stdout_of([str(OPTRACE), "report", "-i", str(out), "--format", "folded"]),
        report=[str(OPTRACE), "report", "-i"],
        report_shown="optrace report -i optrace.data",
        sample_count=_optrace_samples,
    ),
    "perf": Tool(
        name="perf record -g",
        record_pid=lambda pid, hz, out: [PERF, "record", "-e", "cpu-clock", "-F", str(hz), "-g", "-p", str(pid),
                                         "-o", str(out)],
        record_system=lambda hz, secs, out: [PERF, "record", "-e", "cpu-clock", "-F", str(hz), "-g", "-a",
                                             "-o", str(out), "--", "sleep", str(secs)],
        writes_stdout=False,
        stacks_text=lambda out: _stdout_of([PERF, "script", "-i", str(out), "-F", "ip,sym"]),
        report=[PERF, "report", "--stdio", "-i"],
        report_shown="perf report --stdio -i perf.data",
        sample_count=_perf_samples,
    ),
    "bcc": Tool(
        name="BCC profile",
        record_pid=lambda pid, hz, out: [BCC_PROFILE, "-F", str(hz), "-f", "-p", str(pid)],
        record_system=lambda hz, secs, out: [BCC_PROFILE, "-F", str(hz), "-f", str(int(secs))],
        writes_stdout=True,
        stacks_text=lambda out: out.read_text(errors="replace"),
        report=None,
        report_shown="(prints its folded stacks at exit)",
        sample_count=_folded_samples,
    ),
}


def log(message: str) -> None:
    print(f"[bench_profile {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Target:
    """A workload started with a pipe on stdin: it waits for a line to start and for EOF to exit."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.first_line = self.proc.stdout.readline().strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> str:
        """Start the work; returns its result line."""
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Recording:
    """One profiler run: started, optionally stopped with SIGINT, reaped; its output file and costs."""

    def __init__(self, tool: Tool, argv: list[str], out: Path):
        self.tool, self.out = tool, out
        self._stdout = open(out, "w") if tool.writes_stdout else None
        self._stderr = tempfile.TemporaryFile()
        self.launched = Launched.start(argv, stdout=self._stdout or subprocess.DEVNULL, stderr=self._stderr)

    def stop(self, interrupt: bool = True) -> tuple[ToolRun, int | None]:
        if interrupt:
            self.launched.interrupt()
        run = self.launched.finish()
        self._stderr.seek(0)
        stderr = self._stderr.read().decode(errors="replace")
        self._stderr.close()
        if self._stdout:
            self._stdout.close()
        if run.returncode not in (0, 130, -2) or not self.out.exists() or not self.out.stat().st_size:
            raise RuntimeError(f"{self.tool.name} failed (status {run.returncode}): {stderr.strip()[-400:]}")
        return run, self.tool.sample_count(stderr, self.out)


# (a) slowdown ------------------------------------------------------------------------------------------

def fixed_work(tool: Tool | None, hz: int, out: Path) -> dict:
    """One run of the fixed-work target, profiled by tool (attached and settled first) or not."""
    target = Target([str(WORKLOADS / "bench-fixed"), str(WORK_ITERATIONS)])
    recording = None
    if tool:
        recording = Recording(tool, tool.record_pid(target.pid, hz, out), out)
        attached_s = recording.launched.wait_attached()
    result = json.loads(target.release())
    row = {"wall_s": result["wall_s"], "cpu_s": result["cpu_s"]}
    if recording:
        run, samples = recording.stop()
        row.update(tool_cpu_s=run.cpu_s, tool_maxrss_kb=run.maxrss_kb, samples=samples, attached_s=attached_s)
    target.close()
    return row


def measure_slowdown(tools: dict[str, Tool], pairs: int, workdir: Path) -> dict:
    """Paired runs, baseline and profiled back to back in random order, so machine noise that lasts
    longer than one pair cancels in the ratio; the median ratio is the slowdown."""
    results: dict = {}
    for hz in FREQUENCIES:
        for key, tool in tools.items():
            ratios, cpu_ratios, rows = [], [], []
            for i in range(pairs):
                out = workdir / f"slowdown-{key}-{hz}-{i}.out"
                order = [None, tool]
                random.shuffle(order)
                runs = {("profiled" if t else "baseline"): fixed_work(t, hz, out) for t in order}
                ratios.append(runs["profiled"]["wall_s"] / runs["baseline"]["wall_s"])
                cpu_ratios.append(runs["profiled"]["cpu_s"] / runs["baseline"]["cpu_s"])
                rows.append(runs)
                out.unlink(missing_ok=True)
            log(f"slowdown {key} {hz} Hz: wall ratios {', '.join(f'{r:.4f}' for r in ratios)}")
            results.setdefault(str(hz), {})[key] = {
                "slowdown_pct": (median(ratios) - 1) * 100,
                "slowdown_iqr_pct": [(q - 1) * 100 for q in quartiles(ratios) or ()],
                "cpu_slowdown_pct": (median(cpu_ratios) - 1) * 100,
                "expected_samples": hz * median([r["profiled"]["cpu_s"] for r in rows]),
                "samples_median": median([r["profiled"]["samples"] for r in rows if r["profiled"]["samples"]]),
                "tool_cpu_s_median": median([r["profiled"]["tool_cpu_s"] for r in rows]),
                "tool_maxrss_kb_median": median([r["profiled"]["tool_maxrss_kb"] for r in rows]),
                "attached_s": [r["profiled"]["attached_s"] for r in rows],
                "pairs": rows,
            }
    return results


# (b) time to first sample ------------------------------------------------------------------------------

def first_sample(tool: Tool, hz: int, out: Path) -> dict:
    """The target runs slot_000, slot_001, ... each SLOT_MS of wall time from its start; the tool is
    launched right after it starts. The earliest slot in the tool's own output dates its first
    sample: time to first sample = middle of that slot - tool launch (+- half a slot)."""
    target = Target([str(WORKLOADS / "bench-phases"), str(SLOT_MS)])
    target_start = float(target.first_line)
    recording = Recording(tool, tool.record_pid(target.pid, hz, out), out)
    attached_s = recording.launched.wait_attached(settle_s=0.3)
    time.sleep(0.5)
    recording.stop()
    target.close(kill=True)
    slots = [int(s) for s in SLOT_NAME.findall(tool.stacks_text(out))]
    out.unlink(missing_ok=True)
    if not slots:
        return {"first_sample_s": None, "attached_s": attached_s}
    first = min(slots)
    return {
        "first_sample_s": target_start + (first + 0.5) * SLOT_MS / 1000 - recording.launched.started,
        "attached_s": attached_s,
        "first_slot": first,
    }


def measure_first_sample(tools: dict[str, Tool], repeats: int, workdir: Path) -> dict:
    results = {}
    for key, tool in tools.items():
        runs = [first_sample(tool, 999, workdir / f"ttfs-{key}-{i}.out") for i in range(repeats)]
        firsts = [r["first_sample_s"] for r in runs if r["first_sample_s"] is not None]
        log(f"first sample {key}: {runs}")
        results[key] = {
            "first_sample_s": median(firsts),
            "attached_s": median([r["attached_s"] for r in runs]),
            "runs": runs,
        }
    return results


# (d) system-wide file size, (c) its peak RSS, (e) report time -------------------------------------------

class BackgroundLoad:
    """The same load for every tool: the demo workload on one CPU and a short-lived process
    (shortlived, 20 ms of CPU) started every 100 ms, so files see many processes and mappings."""

    def __init__(self, seconds: float):
        self.demo = subprocess.Popen([str(WORKLOADS / "demo"), str(seconds * 2)])
        self._stop = threading.Event()
        self.spawned = 0
        self._thread = threading.Thread(target=self._spawn, daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        while not self._stop.wait(0.1):
            subprocess.run([str(WORKLOADS / "shortlived"), "20"])
            self.spawned += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.demo.terminate()
        self.demo.wait()


def measure_system_wide(tools: dict[str, Tool], seconds: float, hz: int, workdir: Path) -> dict:
    results = {}
    for key, tool in tools.items():
        out = workdir / f"system-{key}.data"
        load = BackgroundLoad(seconds)
        try:
            time.sleep(1.0)
            recording = Recording(tool, tool.record_system(hz, seconds, out), out)
            run, samples = recording.stop(interrupt=False)
        finally:
            load.stop()
        results[key] = {
            "file_bytes": out.stat().st_size,
            "samples": samples,
            "maxrss_kb": run.maxrss_kb,
            "tree_rss_kb": run.tree_rss_kb,
            "tool_cpu_s": run.cpu_s,
            "wall_s": run.wall_s,
            "short_lived_processes": load.spawned,
            "path": str(out),
        }
        log(f"system-wide {key}: {results[key]}")
    return results


def measure_report_time(tools: dict[str, Tool], system: dict, repeats: int) -> dict:
    results = {}
    for key, tool in tools.items():
        if tool.report is None or key not in system:
            continue
        runs = [run_timed(tool.report + [system[key]["path"]]) for _ in range(repeats)]
        if any(r.returncode for r in runs):
            raise RuntimeError(f"{tool.name}: report failed with status {[r.returncode for r in runs]}")
        results[key] = {
            "wall_s": median([r.wall_s for r in runs]),
            "cpu_s": median([r.cpu_s for r in runs]),
            "maxrss_kb": median([r.maxrss_kb for r in runs]),
            "runs_wall_s": [r.wall_s for r in runs],
        }
        log(f"report {key}: {results[key]}")
    return results


# targets and markdown ------------------------------------------------------------------------------------

def targets(res: dict) -> list[dict]:
    out = []
    slow = res.get("slowdown", {})
    if "optrace" in slow.get("99", {}):
        value = slow["99"]["optrace"]["slowdown_pct"]
        out.append({"name": "profile: slowdown at 99 Hz", "target": "<= 1%", "measured": f"{value:+.2f}%",
                    "met": value <= 1.0})
    if {"optrace", "perf"} <= set(slow.get("999", {})):
        mine, perf = slow["999"]["optrace"]["slowdown_pct"], slow["999"]["perf"]["slowdown_pct"]
        out.append({"name": "profile: slowdown at 999 Hz", "target": "no worse than perf record -g",
                    "measured": f"optrace {mine:+.2f}% vs perf {perf:+.2f}%", "met": mine <= perf})
    system = res.get("system_wide", {})
    if {"optrace", "perf"} <= set(system):
        ratio = system["perf"]["file_bytes"] / system["optrace"]["file_bytes"]
        out.append({"name": "profile: file size (30 s system-wide)", "target": ">= 20x smaller than perf.data",
                    "measured": f"{ratio:.1f}x smaller", "met": ratio >= 20})
    report = res.get("report", {})
    if {"optrace", "perf"} <= set(report):
        mine, perf = report["optrace"]["wall_s"], report["perf"]["wall_s"]
        out.append({"name": "profile: report time", "target": "faster than perf report --stdio",
                    "measured": f"{mine:.2f} s vs {perf:.2f} s", "met": mine < perf})
    return out


def fmt(value, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def attach_summary(res: dict, key: str) -> str:
    times = [t for by_tool in res.get("slowdown", {}).values() for t in by_tool.get(key, {}).get("attached_s", [])]
    return f"{median(times):.2f} ({min(times):.2f}..{max(times):.2f}, n={len(times)})" if times else "n/a"


def markdown(res: dict, tools: dict[str, Tool]) -> str:
    cfg = res["config"]
    parts = ["## Profiler (issue 2): optrace record vs perf record -g vs BCC profile", ""]
    rows = []
    for hz, by_tool in res.get("slowdown", {}).items():
        for key, r in by_tool.items():
            iqr = r["slowdown_iqr_pct"]
            rows.append([f"{hz} Hz", tools[key].name, f"{r['slowdown_pct']:+.2f}%",
                         f"{iqr[0]:+.2f}% .. {iqr[1]:+.2f}%" if iqr else "n/a", f"{r['cpu_slowdown_pct']:+.2f}%",
                         f"{fmt(r['samples_median'], '.0f')} / {r['expected_samples']:.0f}",
                         f"{r['tool_cpu_s_median']:.2f}", f"{r['tool_maxrss_kb_median'] / 1024:.0f}"])
    parts += [f"### (a) Slowdown of a fixed-work target (median of {cfg['pairs']} paired runs)", "",
              md_table(["freq", "tool", "wall slowdown", "IQR", "CPU-time slowdown", "samples got / expected",
                        "tool CPU s", "tool peak RSS MB"], rows), ""]
    rows = [[tools[k].name, fmt(r["first_sample_s"], ".2f"), ", ".join(fmt(x["first_sample_s"], ".2f") for x in r["runs"]),
             fmt(r["attached_s"], ".2f"), attach_summary(res, k)] for k, r in res.get("first_sample", {}).items()]
    parts += ["### (b) Time to first sample (seconds from tool launch; 999 Hz, `-p PID`)", "",
              md_table(["tool", "first sample (median)", "runs", "perf events attached",
                        "attached, median (min..max) over the sessions of (a)"], rows), ""]
    system = res.get("system_wide", {})
    rows = [[tools[k].name, f"{r['maxrss_kb'] / 1024:.0f}", f"{r['tree_rss_kb'] / 1024:.0f}",
             f"{r['tool_cpu_s']:.2f}"] for k, r in system.items()]
    parts += [f"### (c) Peak RSS and CPU of the profiler ({cfg['system_seconds']:.0f} s system-wide, "
              f"{cfg['system_hz']} Hz, background load)", "",
              md_table(["tool", "peak RSS MB (largest process)", "peak RSS MB (process tree)", "tool CPU s"], rows), ""]
    perf_bytes = system.get("perf", {}).get("file_bytes")
    rows = [[tools[k].name, Path(r["path"]).name, f"{r['file_bytes'] / 1024:.1f}", fmt(r["samples"], "d"),
             f"{perf_bytes / r['file_bytes']:.1f}x" if perf_bytes else "n/a"] for k, r in system.items()]
    parts += [f"### (d) File size ({cfg['system_seconds']:.0f} s system-wide, {cfg['system_hz']} Hz)", "",
              md_table(["tool", "file", "KiB", "samples", "perf.data / file"], rows), ""]
    rows = [[f"`{tools[k].report_shown}`", f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}", f"{r['maxrss_kb'] / 1024:.0f}"]
            for k, r in res.get("report", {}).items()]
    parts += [f"### (e) Report time on the files of (d) (median of {cfg['report_repeats']})", "",
              md_table(["report command", "wall s", "CPU s", "peak RSS MB"], rows), ""]
    rows = [[t["name"], t["target"], t["measured"], "met" if t["met"] else "NOT met"] for t in res["targets"]]
    parts += ["### Targets", "", md_table(["what", "target", "measured", "verdict"], rows), "", METHOD.format(**cfg)]
    return "\n".join(parts)


METHOD = """### Method
- Same machine, same run, same workloads, tools one after another; all three sample the software
  `cpu-clock` event (no PMU in this VM) with user + kernel stacks (frame pointers).
- (a) `workloads/build/bench-fixed {iterations}`: a fixed number of steps of an integer recurrence, four
  calls deep; it times its own work (CLOCK_MONOTONIC wall, process CPU time) after a go line on stdin.
  Each tool attaches to it with `-p PID` (the one mode all three share: `optrace record -p`,
  `perf record -e cpu-clock -g -p`, `profile-bpfcc -f -p`); the go line is sent once the tool's perf
  events are open and unchanged for 0.5 s, so start-up cost is not counted here (it is in (b) and in
  "tool CPU s"). Each pair is one baseline and one profiled run in random order; slowdown = median over
  pairs of profiled/baseline wall time - 1 (IQR over pairs alongside). The machine is shared and noisy:
  read differences smaller than the IQR as noise.
- (b) `workloads/build/bench-phases {slot_ms:.0f}` runs slot_000, slot_001, ... each for {slot_ms:.0f} ms of wall time
  from its start; the tool is launched (at 999 Hz, `-p PID`) right after it starts. The earliest slot
  named in the tool's own output dates the first sample it recorded: time to first sample = middle of
  that slot - tool launch (resolution +-{half_slot:.1f} ms). "perf events attached" is when the tool's sampling
  events were open (polled in /proc/PID/fd). For BCC-based tools this is dominated by the clang compile.
- (c) peak RSS from wait4 (`ru_maxrss` of the tool's largest process; exact) and the sum of VmHWM over
  the tool's process tree (polled every 50 ms), during the runs of (d).
- (d) each tool records the whole machine for {system_seconds:.0f} s at {system_hz} Hz (`optrace record -a -d`,
  `perf record -a -- sleep`, `profile-bpfcc -f SECONDS`, its folded stdout being its file) while the
  same background load runs: `workloads/build/demo` on one CPU and a 20 ms `shortlived` process started
  every 100 ms.
- (e) `optrace report -i FILE` (table) vs `perf report --stdio -i perf.data` on the files of (d), output
  to /dev/null, median wall time of {report_repeats} runs. BCC's profile has no report step (it prints at exit).
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 pairs, 8 s system-wide: a smoke run")
    parser.add_argument("--pairs", type=int, default=None)
    parser.add_argument("--system-seconds", type=float, default=None)
    parser.add_argument("--tools", default="optrace,perf,bcc")
    args = parser.parse_args()
    tools = {key: TOOLS[key] for key in args.tools.split(",")}
    cfg = {
        "pairs": args.pairs or (2 if args.quick else 5),
        "system_seconds": args.system_seconds or (8.0 if args.quick else 30.0),
        "system_hz": 99,
        "report_repeats": 3,
        "ttfs_repeats": 1 if args.quick else 2,
        "iterations": WORK_ITERATIONS,
        "slot_ms": SLOT_MS,
        "half_slot": SLOT_MS / 2,
        "frequencies": list(FREQUENCIES),
        "tools": list(tools),
    }
    subprocess.run(["make", "-s", "-C", str(WORKLOADS.parent)], check=True)
    res: dict = {"area": "profile", "config": cfg}
    with tempfile.TemporaryDirectory(prefix="optrace-bench-") as tmp:
        workdir = Path(tmp)
        res["first_sample"] = measure_first_sample(tools, cfg["ttfs_repeats"], workdir)
        res["slowdown"] = measure_slowdown(tools, cfg["pairs"], workdir)
        res["system_wide"] = measure_system_wide(tools, cfg["system_seconds"], cfg["system_hz"], workdir)
        res["report"] = measure_report_time(tools, res["system_wide"], cfg["report_repeats"])
    res["targets"] = targets(res)
    write_results("profile", res)
    print(markdown(res, tools))
    return 0


if __name__ == "__main__":
    sys.exit(main())
