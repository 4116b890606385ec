"""Issues 36 and 42 benchmark: time from launch to the first sample, and for `record -- CMD` to the command's
exec (issue 42: it used to wait for its unwind tables after the attach), optrace vs perf vs bpftrace vs BCC's profile,
side by side and interleaved, on a quiet machine and with a CPU hog on every CPU; and serve's memory once
started. Prints a markdown section on stdout, progress on stderr, writes bench/results/startup.json.

(a) `record -p PID` of a running target and (b) `record -- CMD`: the target (workloads/bench-phases) spends
wall-clock slot k in its function slot_K, so the earliest slot named in a tool's output dates its first
sample. optrace runs warm (its BPF programs, unwind tables and kernel symbols stored by an earlier run: the
state once a machine has run optrace) and cold (an empty cache directory: everything compiled, converted
and parsed, as a first run on a machine); ``--baseline OPTRACE`` adds another optrace (an older checkout's
executable) run both ways, for the cold run's "no slower than before".
(c) serve's RSS once started, warm and cold, and whether LLVM is mapped.
(d) the primitives a stored program can be loaded through (bench/primitives.py): BCC's own without its
compiler (libbcc_bpf.so), Debian's libbpf.so.1, bpf(2) through ctypes.

Run as root:
    .venv/bin/python bench/bench_startup.py [--rounds N] [--quick] [--baseline PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (OPTRACE, ROOT, WORKLOADS, Launched, md_table, median, process_tree, provenance,  # noqa: E402
                      read_status_kb, write_results)

BENCH_BUDGET_S = 1500
ROUNDS = 5
HZ = 999
SLOT_MS = 25.0
SETTLE_S = 0.3  # the tool's perf events unchanged this long: it has attached
AFTER_ATTACH_S = 0.5  # then recorded this long more
FINISH_S = 60.0  # after Ctrl-C a tool has this long to write its output (then it is killed: a failed run)
SLOTS = 800  # bench-phases' slots: a tool that starts sampling later than SLOTS x SLOT_MS sees none
SLOT_NAME = re.compile(r"slot_(\d{3})")
PERF = "/usr/bin/perf"
BPFTRACE = "/usr/bin/bpftrace"
BCC_PROFILE = "/usr/sbin/profile-bpfcc"
PHASES = str(WORKLOADS / "bench-phases")
CONDITIONS = ("quiet", "hogs")
MODES = ("pid", "cmd")
BASELINE_VARIABLE = "BENCH_BASELINE_OPTRACE"
SERVE_ROUNDS = 3
SERVE_RSS_TARGET_MB = 60
SERVE_SETTLE_S = 3.0  # after "serving": the first drains are done
PRIMITIVE_ROUNDS = 20


def log(message: str) -> None:
    print(f"[bench_startup {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _stdout_of(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300).stdout


def _empty_cache_env(workdir: Path) -> list[str]:
    """An argv prefix running optrace with a new, empty cache directory: nothing stored (optrace/cachedir.py)."""
    return ["env", f"OPTRACE_CACHE_DIR={tempfile.mkdtemp(prefix='cold-', dir=workdir)}"]


@dataclass(frozen=True)
class Tool:
    """``record(target, out, workdir)``: argv recording ``target`` (["-p", PID] or ["--", CMD...]) into
    ``out``; ``stacks(out, stdout)``: the sampled stacks as text naming functions."""

    name: str
    record: Callable[[list[str], Path, Path], list[str]]
    stacks: Callable[[Path, str], str]
    modes: tuple[str, ...] = MODES


def optrace_tool(name: str, executable: str, cold: bool) -> Tool:
    def record(target: list[str], out: Path, workdir: Path) -> list[str]:
        prefix = _empty_cache_env(workdir) if cold else []
        return [*prefix, executable, "record", "-F", str(HZ), "-o", str(out), *target]

    return Tool(name, record, lambda out, _: _stdout_of([executable, "report", "-i", str(out), "--format", "folded"]))


def bpftrace_record(target: list[str], out: Path, workdir: Path) -> list[str]:
    if target[0] == "-p":
        return [BPFTRACE, "-o", str(out), "-e", f"profile:hz:{HZ} /pid == {target[1]}/ {{ @[ustack] = count(); }}"]
    return [BPFTRACE, "-o", str(out), "-c", " ".join(target[1:]),
            "-e", f"profile:hz:{HZ} /pid == cpid/ {{ @[ustack] = count(); }}"]


TOOLS = {
    "optrace": optrace_tool("optrace record (warm: programs, tables and symbols stored)", str(OPTRACE), cold=False),
    "optrace_cold": optrace_tool("optrace record (cold: first run, nothing stored)", str(OPTRACE), cold=True),
    "perf": Tool("perf record -g",
                 lambda target, out, _: [PERF, "record", "-e", "cpu-clock", "-F", str(HZ), "-g", "-o", str(out), *target],
                 lambda out, _: _stdout_of([PERF, "script", "-i", str(out), "-F", "ip,sym"])),
    "bpftrace": Tool("bpftrace profile:hz (ustack)", bpftrace_record, lambda out, _: out.read_text(errors="replace")),
    "bcc": Tool("BCC profile", lambda target, out, _: [BCC_PROFILE, "-F", str(HZ), "-f", *target],
                lambda out, stdout: stdout, modes=("pid",)),
}


# (a), (b) time to first sample ---------------------------------------------------------------------------

class Hogs:
    """A busy loop per CPU (a shell's, at normal priority) while the block runs."""

    def __init__(self, enabled: bool) -> None:
        self.procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)] \
            if enabled else []

    def __enter__(self) -> "Hogs":
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def first_sample(tool: Tool, mode: str, workdir: Path, run: int) -> dict:
    """Launch the tool on a bench-phases target (-p: started just before the tool; cmd: started by it),
    stop it once attached and recording for AFTER_ATTACH_S; the earliest slot in its output dates its
    first sample: time to first sample = target start + middle of that slot - tool launch."""
    out = workdir / f"run-{run}.out"
    stdout_file = workdir / f"run-{run}.stdout"
    target = None
    with open(stdout_file, "w") as stdout:
        if mode == "pid":
            target = subprocess.Popen([PHASES, str(SLOT_MS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            target_start = float(target.stdout.readline())
            argv = tool.record(["-p", str(target.pid)], out, workdir)
        else:
            argv = tool.record(["--", PHASES, str(SLOT_MS)], out, workdir)
        launched = Launched.start(argv, stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.DEVNULL)
        leftovers: list[int] = []
        try:
            attached = launched.wait_attached(SETTLE_S, timeout_s=120)
            time.sleep(AFTER_ATTACH_S)
            leftovers = process_tree(launched.pid)[1:]  # a command mode's target, killed once the tool is done
            launched.interrupt()
            cost = launched.finish(timeout_s=FINISH_S)
        finally:
            if launched.popen.returncode is None:
                launched.popen.kill()
                launched.finish()
            for pid in leftovers:
                _kill(pid)
            if target is not None:
                target.kill()
                target.wait()
    stdout_text = stdout_file.read_text(errors="replace")
    exec_s = {}
    if mode == "cmd":
        match = re.search(r"^(\d+\.\d{6})$", stdout_text, re.M)
        if not match:
            return {"error": f"no target start time in the tool's stdout: {stdout_text[:200]!r}"}
        target_start = float(match.group(1))
        exec_s = {"exec_s": target_start - launched.started}  # the command's main() runs: exec'd
    slots = [int(s) for s in SLOT_NAME.findall(tool.stacks(out, stdout_text))] if out.exists() or stdout_text else []
    out.unlink(missing_ok=True)
    if not slots and attached > SLOTS * SLOT_MS / 1000:  # sampling began after the target's last slot
        return {"first_sample_s": float("inf"), "attached_s": attached, "tool_cpu_s": cost.cpu_s, **exec_s}
    if not slots:
        return {"error": f"no slot sampled (status {cost.returncode})", "attached_s": attached, **exec_s}
    first = min(slots)
    return {"first_sample_s": target_start + (first + 0.5) * SLOT_MS / 1000 - launched.started,
            "attached_s": attached, "first_slot": first, "tool_cpu_s": cost.cpu_s, **exec_s}


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def measure_first_samples(tools: dict[str, Tool], rounds: int, workdir: Path) -> dict:
    """Each round, per condition (quiet, hogs): every tool once per mode, in a new random order."""
    runs: dict = {cond: {mode: {key: [] for key, tool in tools.items() if mode in tool.modes} for mode in MODES}
                  for cond in CONDITIONS}
    counter = 0
    for round_ in range(rounds):
        for cond in CONDITIONS:
            with Hogs(cond == "hogs"):
                time.sleep(0.5 if cond == "hogs" else 0)
                jobs = [(mode, key) for mode in MODES for key in runs[cond][mode]]
                for mode, key in random.sample(jobs, len(jobs)):
                    counter += 1
                    try:
                        result = first_sample(tools[key], mode, workdir, counter)
                    except Exception as exc:  # one broken tool run must not hide the others
                        result = {"error": f"{type(exc).__name__}: {exc}"}
                    result["round"] = round_
                    runs[cond][mode][key].append(result)
                    log(f"round {round_ + 1}/{rounds} {cond} {mode} {key}: {result}")
    return runs


def summary(results: list[dict]) -> dict:
    values = [r["first_sample_s"] for r in results if "first_sample_s" in r]
    execs = [r["exec_s"] for r in results if "exec_s" in r]
    return {"median": median(values), "min": min(values, default=None), "max": max(values, default=None),
            "runs": len(values), "failed": len(results) - len(values),
            "tool_cpu_s": median([r["tool_cpu_s"] for r in results if "tool_cpu_s" in r]),
            "exec_median": median(execs), "exec_min": min(execs, default=None), "exec_max": max(execs, default=None)}


def paired_ratio(mine: list[dict], theirs: list[dict], key: str = "first_sample_s") -> float | None:
    """Median over rounds of mine/theirs (the same round: the same machine state)."""
    by_round = {r["round"]: r[key] for r in theirs if key in r}
    ratios = [r[key] / by_round[r["round"]] for r in mine if key in r and by_round.get(r["round"])]
    return median(ratios)


# (c) serve's memory ----------------------------------------------------------------------------------------

def serve_rss(cold: bool, workdir: Path) -> dict:
    prefix = _empty_cache_env(workdir) if cold else []
    proc = subprocess.Popen([*prefix, str(OPTRACE), "serve", "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        lines: list[str] = []
        while time.monotonic() < deadline and not any("serving" in line for line in lines):
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
        pid = proc.pid  # env execs optrace, whose script is run by python in this process
        at_start = read_status_kb(pid, "VmRSS") / 1024
        time.sleep(SERVE_SETTLE_S)
        maps = Path(f"/proc/{pid}/maps").read_text()
        return {"rss_mb": at_start, "settled_rss_mb": read_status_kb(pid, "VmRSS") / 1024,
                "hwm_mb": read_status_kb(pid, "VmHWM") / 1024, "llvm_mapped": "libLLVM" in maps or "libclang" in maps,
                "log": [line.strip() for line in lines if "BPF programs" in line]}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure_serve(rounds: int, workdir: Path) -> dict:
    """Warm: programs stored (``stored_runs``: how many runs said so in their log, the verdict's runs)."""
    runs: dict[str, list[dict]] = {"warm": [], "cold": []}
    serve_rss(False, workdir)  # stores serve's program if a change since the warm-up made it another
    for round_ in range(rounds):
        for state in random.sample(list(runs), 2):
            runs[state].append(serve_rss(state == "cold", workdir))
            log(f"serve {state} round {round_ + 1}/{rounds}: {runs[state][-1]}")
    return {state: {"rss_mb": median([r["rss_mb"] for r in results]),
                    "rss_range": [min(r["rss_mb"] for r in results), max(r["rss_mb"] for r in results)],
                    "settled_rss_mb": median([r["settled_rss_mb"] for r in results]),
                    "hwm_mb": median([r["hwm_mb"] for r in results]),
                    "llvm_mapped": any(r["llvm_mapped"] for r in results),
                    "stored_runs": sum(1 for r in results if any(" stored " in line for line in r["log"])),
                    "runs": results}
            for state, results in runs.items()}


# (d) the primitives --------------------------------------------------------------------------------------

def measure_primitives(rounds: int) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "primitives.py"), str(rounds)], capture_output=True,
                         text=True, timeout=600)
    if out.returncode:
        return {"error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout)


# verdicts and the section ----------------------------------------------------------------------------------

def targets(res: dict) -> list[dict]:
    found = []
    ttfs = res["first_sample"]
    for cond in CONDITIONS:
        for mode in MODES:
            by_tool = ttfs[cond][mode]
            mine, perf = by_tool.get("optrace"), by_tool.get("perf")
            if mode == "cmd" and mine and perf and mine["exec_median"] is not None and perf["exec_median"] is not None:
                found.append({"name": f"startup: the command's exec, record -- CMD, {cond}, warm",
                              "target": "<= perf record's in the same run",
                              "measured": f"{mine['exec_median']:.3f} s vs {perf['exec_median']:.3f} s (paired ratio "
                                          f"{_ratio(mine['paired_perf_exec'])})",
                              "met": mine["exec_median"] <= perf["exec_median"]})
            if mine and perf and mine["median"] is not None and perf["median"] is not None:
                found.append({"name": f"startup: first sample, record {MODE_SHOWN[mode]}, {cond}, warm",
                              "target": "<= perf record's in the same run",
                              "measured": f"{mine['median']:.2f} s vs {perf['median']:.2f} s (paired ratio "
                                          f"{_ratio(mine['paired_perf'])})",
                              "met": mine["median"] <= perf["median"]})
            cold, before = by_tool.get("optrace_cold"), by_tool.get("baseline_cold")
            if cold and before and cold["median"] is not None and before["median"] is not None:
                found.append({"name": f"startup: first sample, record {MODE_SHOWN[mode]}, {cond}, cold (first run)",
                              "target": "no slower than before this change (its first run)",
                              "measured": f"{cold['median']:.2f} s vs {before['median']:.2f} s",
                              "met": cold["median"] <= before["median"]})
    serve = res.get("serve", {}).get("warm")
    if serve:
        found.append({"name": "startup: serve's RSS once serving, warm", "target": f"<= {SERVE_RSS_TARGET_MB} MB, LLVM "
                      "not mapped", "measured": f"{serve['rss_mb']:.1f} MB ({serve['settled_rss_mb']:.1f} MB "
                      f"{SERVE_SETTLE_S:.0f} s later), LLVM {'mapped' if serve['llvm_mapped'] else 'not mapped'} "
                      f"({serve['stored_runs']} of {len(serve['runs'])} runs loaded stored programs)",
                      "met": serve["rss_mb"] <= SERVE_RSS_TARGET_MB and not serve["llvm_mapped"]
                      and serve["stored_runs"] == len(serve["runs"])})
    return found


MODE_SHOWN = {"pid": "-p PID", "cmd": "-- CMD"}


def _ratio(value: float | None) -> str:
    if value is not None and value in (0.0, float("inf")):
        return "<" if value == 0.0 else ">"  # one of the two started after the target's last slot
    return "n/a" if value is None else f"{value:.2f}x"


def _s(value: float | None) -> str:
    if value == float("inf"):
        return f">{SLOTS * SLOT_MS / 1000:.0f}"  # started after the target's last slot
    return "n/a" if value is None else f"{value:.2f}"


def markdown(res: dict, tools: dict[str, Tool]) -> str:
    cfg = res["config"]
    parts = ["## Start-up (issue 36): time to the first sample, optrace vs perf vs bpftrace vs BCC's profile", "",
             f"Measured {res['provenance']}.", ""]
    for mode in MODES:
        rows = []
        for cond in CONDITIONS:
            for key, s in res["first_sample"][cond][mode].items():
                rows.append([cond, tools[key].name, _s(s["median"]), f"{_s(s['min'])}..{_s(s['max'])}",
                             _ratio(s.get("paired_perf")), _s(s["tool_cpu_s"]),
                             f"{s['runs']}" + (f" ({s['failed']} failed)" if s["failed"] else "")])
        parts += [f"### ({'a' if mode == 'pid' else 'b'}) `record {MODE_SHOWN[mode]}`: seconds from launch to the "
                  f"first sample ({HZ} Hz)", "",
                  md_table(["machine", "tool", "median", "min..max", "/ perf (paired)", "tool CPU s", "runs"], rows), ""]
        if mode == "cmd":
            rows = [[cond, tools[key].name, f"{s['exec_median']:.3f}", f"{s['exec_min']:.3f}..{s['exec_max']:.3f}",
                     _ratio(s.get("paired_perf_exec"))]
                    for cond in CONDITIONS for key, s in res["first_sample"][cond][mode].items()
                    if s.get("exec_median") is not None]
            parts += ["### (b') `record -- CMD`: seconds from launch to the command's exec (its main() running)", "",
                      md_table(["machine", "tool", "median", "min..max", "/ perf (paired)"], rows), ""]
    serve = res.get("serve", {})
    rows = [[state, f"{s['rss_mb']:.1f}", f"{s['rss_range'][0]:.1f}..{s['rss_range'][1]:.1f}",
             f"{s['settled_rss_mb']:.1f}", f"{s['hwm_mb']:.1f}", "yes" if s["llvm_mapped"] else "no"]
            for state, s in serve.items()]
    parts += ["### (c) `optrace serve`: memory once serving", "",
              md_table(["programs", "RSS MB when serving (median)", "min..max", f"RSS MB {SERVE_SETTLE_S:.0f} s later",
                        "peak RSS MB", "LLVM mapped"], rows), ""]
    prims = res.get("primitives", {})
    if "load" in prims:
        rows = [[name, f"{p['cpu_ms']:.1f}", f"{p['cpu_ms_range'][0]:.1f}..{p['cpu_ms_range'][1]:.1f}",
                 f"{p['wall_ms']:.1f}", f"{prims['library'][name]['cpu_ms']:.2f}", f"{prims['library'][name]['rss_mb']:.2f}"]
                for name, p in prims["load"].items()]
        llvm = prims["library"].get("libbcc.so (BCC with LLVM)")
        parts += [f"### (d) A stored program loaded through each primitive ({prims['maps']} maps, "
                  f"{', '.join(prims['functions'])}; median of {prims['rounds']} interleaved rounds)", "",
                  md_table(["primitives", "CPU ms (median)", "min..max", "wall ms", "library load CPU ms",
                            "library load RSS MB"], rows), "",
                  f"For comparison, loading libbcc.so (BCC with its compiler, which maps clang and LLVM): "
                  f"{llvm['cpu_ms']:.1f} ms of CPU, {llvm['rss_mb']:.1f} MB of RSS." if llvm else "", ""]
    elif prims:
        parts += [f"### (d) primitives: failed ({prims.get('error')})", ""]
    rows = [[t["name"], t["target"], t["measured"], "met" if t["met"] else "NOT met"] for t in res["targets"]]
    parts += ["### Targets", "", md_table(["what", "target", "measured", "verdict"], rows), "",
              METHOD.format(**cfg)]
    return "\n".join(parts)


METHOD = """### Method
- `workloads/build/bench-phases {slot_ms:.0f}` spends wall-clock slot k (of {slot_ms:.0f} ms, from its start) in
  slot_K; the earliest slot a tool's output names dates its first sample (+-{half_slot:.1f} ms). (a) the
  target is started, then the tool with `-p PID`; (b) the tool starts it (`record -- CMD`, bpftrace's
  `-c CMD`; BCC's profile has no command mode). Each tool samples cpu-clock at {hz} Hz (bpftrace:
  `profile:hz:{hz}` filtered to the target, user stacks); it is stopped with Ctrl-C once its perf events
  have been unchanged for {settle_s} s and {after_s} s more have passed. Time to first sample = the target's
  start (CLOCK_MONOTONIC, printed by it) + the middle of the first slot sampled - the tool's launch. For (b),
  time to exec = the target's start - the tool's launch (the command's main() running: perf's workload
  waits on a pipe until its events are open, optrace's until its sampler is attached).
- {rounds} rounds; in each, the quiet machine first, then a busy shell loop on every CPU (`sh -c 'while :;
  do :; done'`, normal priority: the tool and the target compete with them); in each condition every
  tool runs once per mode, in a new random order. "/ perf (paired)" is the median over rounds of the
  tool's time over perf's in the same round and condition.
- optrace warm: root's cache directory (/var/cache/optrace) holds the BPF programs, unwind tables and
  kernel symbols an earlier run stored (the state of a machine that has run optrace; `make setup` warms
  it). Cold: `OPTRACE_CACHE_DIR` is a new empty directory per run, so the run compiles its BPF programs,
  converts every unwind table and parses /proc/kallsyms, as a first run on a machine. "tool CPU s" is the
  tool's whole run (start to exit after Ctrl-C, user + system), not only its start-up.
- (c) `optrace serve --listen 127.0.0.1:0`: VmRSS of its process when it says it is serving (the target's
  "after start") and {serve_settle_s:.0f} s later (the whole machine's leaves named by then: it grows with what the
  shared machine runs), its peak, and whether libLLVM/libclang are mapped; warm (programs stored) and cold
  (compiled in the run), {serve_rounds} runs each in random order.
- (d) `bench/primitives.py {primitive_rounds}`: record's sampler (the CFI and Python walkers: the Profiler's own
  sources and options) as the program cache holds it, its maps created and `on_sample` and the walker's
  programs loaded (map fds put into their instructions), then all closed, through each primitive in turn,
  interleaved; CPU is the process's (user + system: the kernel's
  verification and allocation are most of it). "library load": `ctypes.CDLL` in a fresh python3.
- The machine is a shared 2-CPU VM: other engineers' work runs beside these runs, in every condition.
"""


def warm(baseline: str | None, workdir: Path) -> None:
    """Root's cache as `make setup` leaves it (scripts/warm-programs.sh), and the targets' tables stored."""
    subprocess.run(["sh", str(ROOT / "scripts" / "warm-programs.sh")], cwd=ROOT, env={**os.environ, "OPTRACE": str(OPTRACE)},
                   capture_output=True, timeout=600)
    for executable in {str(OPTRACE), baseline or str(OPTRACE)}:
        subprocess.run([executable, "record", "-o", str(workdir / "warm.data"), "--", PHASES, "1"],
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 serve run each: a smoke run")
    parser.add_argument("--baseline", default=os.environ.get(BASELINE_VARIABLE),
                        help=f"another optrace executable (an older checkout's) to run warm and cold (default: "
                             f"${BASELINE_VARIABLE}, which bench/run.py passes on)")
    parser.add_argument("--tools", default=",".join(TOOLS))
    args = parser.parse_args()
    tools = {key: TOOLS[key] for key in args.tools.split(",")}
    if args.baseline:
        tools["baseline"] = optrace_tool(f"optrace before ({args.baseline}), warm", args.baseline, cold=False)
        tools["baseline_cold"] = optrace_tool(f"optrace before ({args.baseline}), cold", args.baseline, cold=True)
    rounds = args.rounds or (2 if args.quick else ROUNDS)
    cfg = {"rounds": rounds, "slot_ms": SLOT_MS, "half_slot": SLOT_MS / 2, "hz": HZ, "settle_s": SETTLE_S,
           "after_s": AFTER_ATTACH_S, "serve_settle_s": SERVE_SETTLE_S,
           "serve_rounds": 1 if args.quick else SERVE_ROUNDS, "tools": list(tools),
           "primitive_rounds": PRIMITIVE_ROUNDS}
    subprocess.run(["make", "-s", "-C", str(WORKLOADS.parent)], check=True)
    shown = [f"{BASELINE_VARIABLE}={args.baseline}", *sys.argv] if args.baseline and "--baseline" not in sys.argv \
        else sys.argv
    res: dict = {"area": "startup", "config": cfg, "provenance": provenance(shown)}
    with tempfile.TemporaryDirectory(prefix="optrace-bench-startup-") as tmp:
        workdir = Path(tmp)
        warm(args.baseline, workdir)
        runs = measure_first_samples(tools, rounds, workdir)
        res["first_sample"] = {cond: {mode: {key: summary(results) for key, results in by_tool.items()}
                                      for mode, by_tool in by_mode.items()} for cond, by_mode in runs.items()}
        for cond, by_mode in runs.items():
            for mode, by_tool in by_mode.items():
                for key, results in by_tool.items():
                    res["first_sample"][cond][mode][key]["paired_perf"] = paired_ratio(results, by_tool.get("perf", []))
                    res["first_sample"][cond][mode][key]["paired_perf_exec"] = paired_ratio(
                        results, by_tool.get("perf", []), "exec_s")
        res["runs"] = runs
        res["serve"] = measure_serve(cfg["serve_rounds"], workdir)
        res["primitives"] = measure_primitives(cfg["primitive_rounds"])
    res["targets"] = targets(res)
    write_results("startup", res)
    print(markdown(res, tools))
    return 0


if __name__ == "__main__":
    sys.exit(main())
