"""Issue 41 benchmark: Python services as they run, side by side: samples per CPU-second of the target.

Three shapes of workloads/pyservice.py (every request burns 3 ms of its thread's CPU time), each under a
client with 16 requests in flight (another process):
- werkzeug: Flask 3.1's own server, threaded=True (a thread per request, as `flask run` serves);
- threads: the standard library's ThreadingHTTPServer (a thread per request);
- gunicorn: a pre-fork master with 2 sync workers forked before the tools attach.
Tools: optrace record -p (with --subprocesses for gunicorn), the optrace of another checkout (--baseline,
e.g. main's: before this change), py-spy 0.4.3 record --nonblocking --format raw (--subprocesses for
gunicorn), perf record -g -p (gunicorn: the master, and the master with its workers listed: perf has no
--subprocesses). Each samples at 99 Hz. A tool is started, and once attached (its perf events unchanged for
SETTLE_S; py-spy: SETTLE_S after its start) the target's CPU time (its processes', /proc/PID/stat) is read,
again WINDOW_S later, then the tool gets Ctrl-C: "per CPU-second" = samples / that CPU time, 99 = every
CPU-second sampled (the samples between the attach and the first read make every tool's figure up to
SETTLE_S / WINDOW_S high). Rounds interleaved, tools in a new random order each round.

(b) What the finer ticks cost: the slowdown of a CPU-bound single-threaded job (workloads/build/bench-fixed, a
fixed number of steps; its own CPU time) under `record -p` at 99 Hz, optrace (1 ms ticks) vs the --baseline
optrace (a tick per period) vs perf vs nothing, interleaved.

Run as root:
    .venv/bin/python bench/bench_services.py [--rounds N] [--baseline PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import OPTRACE, ROOT, Launched, md_table, median, provenance, write_results  # noqa: E402

BENCH_BUDGET_S = 1500
ROUNDS = 3
HZ = 99
WINDOW_S = 8.0
SETTLE_S = 0.3
CONNECTIONS = 16
SERVICE = ROOT / "workloads" / "pyservice.py"
VENV_BIN = ROOT / ".venv" / "bin"
SYSTEM_PYTHON = "/usr/bin/python3.11"
PERF = "/usr/bin/perf"
PYSPY = VENV_BIN / "py-spy"
BASELINE_VARIABLE = "BENCH_BASELINE_OPTRACE"
SAMPLES_LINE = re.compile(r"optrace record: (\d+) samples")


def log(message: str) -> None:
    print(f"[bench_services {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class Service:
    """A running shape: its main process, the processes whose CPU time counts, its port."""

    proc: subprocess.Popen
    pids: list[int]
    port: int

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_threaded(flask: bool) -> Service:
    argv = [str(VENV_BIN / "python"), str(SERVICE), "--flask"] if flask else [SYSTEM_PYTHON, str(SERVICE)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("port "):
        raise RuntimeError(f"{argv} did not start: {line!r}")
    return Service(proc, [proc.pid], int(line.split()[1]))


def start_gunicorn() -> Service:
    proc = subprocess.Popen([str(VENV_BIN / "gunicorn"), "--chdir", str(SERVICE.parent), "-w", "2", "-b", "127.0.0.1:0",
                             "--no-control-socket", "pyservice:application"], stderr=subprocess.PIPE, text=True)
    port, workers = 0, []
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "Listening at:" in line:
            port = int(line.split("Listening at: ")[1].split()[0].rsplit(":", 1)[1])
        elif "Booting worker with pid:" in line:
            workers.append(int(line.rsplit(":", 1)[1]))
    if not port or len(workers) < 2:
        raise RuntimeError("gunicorn did not start its workers")
    drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)  # its log must not fill the pipe
    proc.stderr.close()
    service = Service(proc, [proc.pid, *workers], port)
    service.drain = drain  # type: ignore[attr-defined]
    return service


SHAPES: dict[str, Callable[[], Service]] = {
    "werkzeug": lambda: start_threaded(flask=True),
    "threads": lambda: start_threaded(flask=False),
    "gunicorn": start_gunicorn,
}
SHAPE_SHOWN = {"werkzeug": "Flask 3.1 / werkzeug, threaded=True", "threads": "ThreadingHTTPServer",
               "gunicorn": "gunicorn, 2 sync workers forked before the attach"}


@dataclass(frozen=True)
class Tool:
    name: str
    argv: Callable[[Service, Path], list[str]]  # the recording of the service into a file
    samples: Callable[[Path, str], int]  # from the file and the tool's stderr
    perf_events: bool = True  # attached once its perf events settle (else SETTLE_S after its start)


def optrace_tool(name: str, executable: str, subprocesses: bool = True) -> Tool:
    """``subprocesses``: with --subprocesses on a pre-fork master (an optrace before it had the flag: -p alone)."""
    def argv(service: Service, out: Path) -> list[str]:
        extra = ["--subprocesses"] if subprocesses and len(service.pids) > 1 else []
        return [executable, "record", "-F", str(HZ), "-p", str(service.proc.pid), *extra, "-o", str(out)]

    def samples(out: Path, stderr: str) -> int:
        found = SAMPLES_LINE.findall(stderr)
        return int(found[-1]) if found else 0

    return Tool(name, argv, samples)


def pyspy_argv(service: Service, out: Path) -> list[str]:
    extra = ["--subprocesses"] if len(service.pids) > 1 else []
    return [str(PYSPY), "record", "-p", str(service.proc.pid), *extra, "--nonblocking", "--format", "raw",
            "-r", str(HZ), "-o", str(out)]


def pyspy_samples(out: Path, stderr: str) -> int:
    if not out.exists():
        return 0
    return sum(int(line.rsplit(" ", 1)[1]) for line in out.read_text(errors="replace").splitlines()
               if line.rsplit(" ", 1)[-1].isdigit())


def perf_argv(all_pids: bool) -> Callable[[Service, Path], list[str]]:
    def argv(service: Service, out: Path) -> list[str]:
        pids = service.pids if all_pids else [service.proc.pid]
        return [PERF, "record", "-e", "cpu-clock", "-F", str(HZ), "-g", "-p", ",".join(map(str, pids)), "-o", str(out)]

    return argv


def perf_samples(out: Path, stderr: str) -> int:
    if not out.exists():
        return 0
    text = subprocess.run([PERF, "script", "-i", str(out), "-F", "pid"], capture_output=True, text=True).stdout
    return sum(1 for line in text.splitlines() if line.strip())


def tools(baseline: str | None) -> dict[str, Tool]:
    found = {"optrace": optrace_tool("optrace record -p", str(OPTRACE))}
    if baseline:
        found["baseline"] = optrace_tool(f"optrace before ({baseline}; gunicorn: -p alone)", baseline, subprocesses=False)
    found["pyspy"] = Tool("py-spy 0.4.3 record --nonblocking", pyspy_argv, pyspy_samples, perf_events=False)
    found["perf"] = Tool("perf record -g -p", perf_argv(False), perf_samples)
    found["perf_all"] = Tool("perf record -g -p MASTER,WORKERS", perf_argv(True), perf_samples)
    return found


def measure(tool: Tool, service: Service, workdir: Path, run: int) -> dict:
    out = workdir / f"run-{run}.out"
    err = workdir / f"run-{run}.err"
    with open(err, "w") as stderr:
        launched = Launched.start(tool.argv(service, out), stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            if tool.perf_events:
                launched.wait_attached(SETTLE_S, timeout_s=120)
            else:
                time.sleep(SETTLE_S)
            cpu_before = cpu_seconds(service.pids)
            time.sleep(WINDOW_S)
            cpu = cpu_seconds(service.pids) - cpu_before
            launched.interrupt()
            cost = launched.finish(timeout_s=120)
        finally:
            if launched.popen.returncode is None:
                launched.popen.kill()
                launched.finish()
    samples = tool.samples(out, err.read_text(errors="replace"))
    out.unlink(missing_ok=True)
    return {"samples": samples, "cpu_s": cpu, "per_cpu_s": samples / cpu if cpu else None, "tool_cpu_s": cost.cpu_s}


FIXED = ROOT / "workloads" / "build" / "bench-fixed"
FIXED_ITERATIONS = 2_500_000_000  # about 3 s of CPU here


def fixed_job_cpu(tool: Tool | None, workdir: Path, run: int) -> float:
    """bench-fixed's own CPU time for its work, with ``tool`` recording it by pid (attached before it starts)."""
    target = subprocess.Popen([str(FIXED), str(FIXED_ITERATIONS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    launched = None
    try:
        target.stdout.readline()  # ready
        if tool is not None:
            service = Service(target, [target.pid], 0)
            launched = Launched.start(tool.argv(service, workdir / f"fixed-{run}.out"), stderr=subprocess.DEVNULL)
            launched.wait_attached(SETTLE_S, timeout_s=120)
        target.stdin.write("go\n")
        target.stdin.flush()
        result = json.loads(target.stdout.readline())
        return result["cpu_s"]
    finally:
        if launched is not None:
            launched.interrupt()
            launched.finish(timeout_s=120)
        target.kill()
        target.wait()
        (workdir / f"fixed-{run}.out").unlink(missing_ok=True)


def measure_cost(chosen: dict[str, Tool], rounds: int, workdir: Path) -> dict[str, list[float]]:
    cost_tools = {key: chosen[key] for key in ("optrace", "baseline", "perf") if key in chosen}
    runs: dict[str, list[float]] = {"none": [], **{key: [] for key in cost_tools}}
    counter = 0
    for round_ in range(rounds):
        for key in random.sample(list(runs), len(runs)):
            counter += 1
            runs[key].append(fixed_job_cpu(cost_tools.get(key), workdir, counter))
            log(f"cost round {round_ + 1}/{rounds} {key}: {runs[key][-1]:.3f} s")
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--baseline", default=os.environ.get(BASELINE_VARIABLE))
    args = parser.parse_args()
    chosen = tools(args.baseline)
    shown = [f"{BASELINE_VARIABLE}={args.baseline}", *sys.argv] if args.baseline and "--baseline" not in sys.argv \
        else sys.argv
    res: dict = {"area": "services", "provenance": provenance(shown), "load_at_start": os.getloadavg(),
                 "config": {"rounds": args.rounds, "hz": HZ, "window_s": WINDOW_S, "connections": CONNECTIONS}}
    runs: dict[str, dict[str, list[dict]]] = {shape: {key: [] for key in chosen if key != "perf_all" or shape == "gunicorn"}
                                              for shape in SHAPES}
    counter = 0
    with tempfile.TemporaryDirectory(prefix="optrace-bench-services-") as tmp:
        workdir = Path(tmp)
        for executable in {str(OPTRACE), args.baseline or str(OPTRACE)}:  # programs stored: warm runs
            subprocess.run([executable, "record", "-o", str(workdir / "warm.data"), "--", "true"], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=600)
        for round_ in range(args.rounds):
            for shape, start in SHAPES.items():
                service = start()
                load = subprocess.Popen([SYSTEM_PYTHON, str(SERVICE), "--load", str(service.port), "3600",
                                         "--connections", str(CONNECTIONS)], stdout=subprocess.DEVNULL)
                try:
                    time.sleep(1.0)
                    for key in random.sample(list(runs[shape]), len(runs[shape])):
                        counter += 1
                        try:
                            result = measure(chosen[key], service, workdir, counter)
                        except Exception as exc:  # one broken run must not hide the others
                            result = {"error": f"{type(exc).__name__}: {exc}"}
                        result["round"] = round_
                        runs[shape][key].append(result)
                        log(f"round {round_ + 1}/{args.rounds} {shape} {key}: {result}")
                finally:
                    load.kill()
                    load.wait()
                    service.stop()
        res["cost"] = measure_cost(chosen, args.rounds + 2, workdir)
    res["runs"] = runs
    res["summary"] = {shape: {key: summarize(results) for key, results in by_tool.items()}
                      for shape, by_tool in runs.items()}
    res["targets"] = targets(res["summary"])
    write_results("services", res)
    print(markdown(res, chosen))
    return 0


def summarize(results: list[dict]) -> dict:
    rates = [r["per_cpu_s"] for r in results if r.get("per_cpu_s") is not None]
    return {"median": median(rates), "min": min(rates, default=None), "max": max(rates, default=None),
            "runs": len(rates), "failed": len(results) - len(rates),
            "cpu_s": median([r["cpu_s"] for r in results if "cpu_s" in r]),
            "tool_cpu_s": median([r["tool_cpu_s"] for r in results if "tool_cpu_s" in r])}


def targets(summary: dict) -> list[dict]:
    found = []
    for shape, by_tool in summary.items():
        mine = by_tool.get("optrace", {}).get("median")
        if mine is None:
            continue
        found.append({"name": f"services: {SHAPE_SHOWN[shape]}, record -p{' --subprocesses' if shape == 'gunicorn' else ''}",
                      "target": f">= 90 % of the samples the target's CPU time gives (>= {0.9 * HZ:.0f} per CPU-second)",
                      "measured": f"{mine:.1f} per CPU-second ({100 * mine / HZ:.0f} %)", "met": mine >= 0.9 * HZ})
    return found


def cost_rows(res: dict, chosen: dict[str, Tool]) -> list[list[str]]:
    none = median(res["cost"]["none"])
    rows = []
    for key, values in res["cost"].items():
        name = "nothing" if key == "none" else chosen[key].name
        rows.append([name, f"{median(values):.3f}", f"{min(values):.3f}..{max(values):.3f}",
                     "" if key == "none" else f"{100 * (median(values) / none - 1):+.1f} %"])
    return rows


def markdown(res: dict, chosen: dict[str, Tool]) -> str:
    rows = []
    for shape, by_tool in res["summary"].items():
        for key, s in by_tool.items():
            if s["median"] is None:
                rows.append([SHAPE_SHOWN[shape], chosen[key].name, "failed", "", "", "", s["failed"]])
                continue
            rows.append([SHAPE_SHOWN[shape], chosen[key].name, f"{s['median']:.1f}", f"{s['min']:.1f}..{s['max']:.1f}",
                         f"{100 * s['median'] / HZ:.0f} %", f"{s['cpu_s']:.2f}", f"{s['tool_cpu_s']:.2f}"])
    load = " ".join(f"{x:.2f}" for x in res["load_at_start"])
    verdicts = [[t["name"], t["target"], t["measured"], "met" if t["met"] else "NOT met"] for t in res["targets"]]
    return "\n".join([
        "## Python services (issue 41): samples per CPU-second of the target, optrace vs py-spy vs perf", "",
        f"Measured {res['provenance']}; load average at start {load}.", "",
        md_table(["shape", "tool", f"samples per CPU-second (median; {HZ} = all)", "min..max", "of the CPU time",
                  "target CPU s in the window (median)", "tool CPU s (median)"], rows), "",
        md_table(["what", "target", "measured", "verdict"], verdicts), "",
        f"(b) The cost of the ticks: a CPU-bound job's own CPU time (s) under `record -p` at {HZ} Hz, "
        f"{len(res['cost']['none'])} interleaved rounds:", "",
        md_table(["recorded by", "CPU s (median)", "min..max", "slowdown"], cost_rows(res, chosen)), "",
        METHOD.format(rounds=res["config"]["rounds"], window=WINDOW_S, settle=SETTLE_S, hz=HZ,
                      connections=CONNECTIONS), ""])


METHOD = """Method: workloads/pyservice.py, every request spinning 3 ms of its thread's CPU time, under a client with
{connections} requests in flight (a separate process). Each tool samples at {hz} Hz; once it has attached (its perf
events unchanged for {settle} s; py-spy {settle} s after its start) the target's CPU time (its processes':
utime + stime, dead threads included) is read, again {window:.0f} s later, then the tool gets Ctrl-C.
"Samples per CPU-second" = the samples it wrote / that CPU time ({hz}: every CPU-second sampled; the samples
between the attach and the first read put every figure up to {settle} / {window:.0f} high). py-spy counts a
sample per active thread and tick, whether the thread holds the GIL or waits for it (its "active" is not
"on a CPU"), so it can pass {hz}. {rounds} rounds, a new service per shape and round, the tools in a new random
order each time. perf -p follows only the threads and children started after it (the gunicorn workers
are older: perf's second line lists them by pid). The machine is a shared 2-CPU VM: other engineers' work
runs beside these runs."""


if __name__ == "__main__":
    sys.exit(main())
