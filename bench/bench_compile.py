"""Completeness of short-lived processes' stacks (issue 43 item 1): another user compiles in a loop while the
whole machine is recorded at 999 Hz for 8 s, by optrace (`record -a -F 999 -d 8`, one or more builds: main
and an earlier commit's worktree) and by `perf record -a -F 999 --call-graph dwarf`, interleaved per round.

Two loops, run as `nobody` (an unprivileged user, files in a folder of its own): "big" compiles a
400-function C file to an object (`gcc -O2 -c`: cc1 ~2 s of CPU, then as), "small" builds a hello-world
(`gcc -O2`: gcc, cc1, as, collect2 and ld each living 50-300 ms).

Per process name (comm), a sample is complete when its outermost user frame is a thread's root (_start,
__libc_start_call_main ...: frontend/unwind/quality.py THREAD_ROOTS), the same rule for both tools; a
kernel-only sample of a compiler process (no user frames, e.g. at exit or inside execve) counts as cut.
The incomplete ones are sorted by shape: kernel_only, exec (the stack is inside execve: the new image is
being loaded), one_frame (a single user frame), unknown ([unknown] outermost), other. optrace's header
outcome counts (machine-wide, `meta.stack_quality`) are kept per run.
Run: `.venv/bin/python bench/bench_compile.py [--rounds 5] [--loops big,small] [--build LABEL=OPTRACE_PATH]`.
Writes bench/results/compile.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import OPTRACE, md_table, median, write_results  # noqa: E402

BENCH_BUDGET_S = 2400  # 5 rounds x 2 loops x (optrace, perf): ~1.5 min a run at load 15-20
NOBODY = 65534
SECONDS = 8
HZ = 999
COMMS = ("gcc", "cc1", "as", "collect2", "ld")
ROOTS = frozenset({"_start", "__libc_start_call_main", "__libc_start_main", "__libc_start_main_impl",
                   "clone3", "__clone3", "clone", "__clone", "start_thread"})
LOOPS = {"big": "gcc -O2 -c big.c -o big.o", "small": "gcc -O2 small.c -o small"}


def make_sources(folder: Path) -> None:
    funcs = [f"int f{i}(int *a, int n) {{ int s = {i}; for (int j = 0; j < n; j++) {{ s += a[j] * {i + 3} ^ "
             f"(s >> 3); if (s % 7 == {i % 7}) s -= a[(j + {i}) % n]; }} return s; }}" for i in range(400)]
    (folder / "big.c").write_text("\n".join(funcs + ["int main(void) { return 0; }", ""]))
    (folder / "small.c").write_text('#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n')
    for path in folder.iterdir():
        path.chmod(0o644)
    folder.chmod(0o777)


def start_loop(folder: Path, loop: str) -> subprocess.Popen:
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
            "sh", "-c", f"while :; do {LOOPS[loop]}; done"]
    return subprocess.Popen(argv, cwd=folder, start_new_session=True)


def stop_loop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the session this script started for the loop, by its id
    proc.wait()


def classify(user: list[str], kernel: list[str]) -> str:
    """The shape of one sample's stack (user and kernel frames, leaf first)."""
    if not user:
        if any("exit_group" in name or name.startswith("do_exit") for name in kernel):
            return "kernel_only_exit"
        if any("execve" in name for name in kernel):
            return "kernel_only_exec"
        return "kernel_only_fault" if any("page_fault" in name for name in kernel) else "kernel_only"
    if user[-1] in ROOTS:
        return "complete"
    if any("execve" in name for name in user):
        return "exec"
    if user[-1] in ("[unknown]",) or user[-1].startswith("[unknown"):
        return "unknown"
    return "one_frame" if len(user) == 1 else "other"


def optrace_shapes(optrace: str, data: Path) -> tuple[dict[str, Counter], dict]:
    folded = subprocess.run([optrace, "report", "-i", str(data), "-f", "folded", "--comm", ",".join(COMMS)],
                            capture_output=True, text=True, check=True).stdout
    shapes: dict[str, Counter] = defaultdict(Counter)
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        comm, *frames = stack.split(";")
        user = [f for f in reversed(frames) if not f.endswith("_[k]")]  # leaf first
        kernel = [f[:-4] for f in reversed(frames) if f.endswith("_[k]")]
        shapes[comm][classify(user, kernel)] += int(count)
    meta = json.loads(subprocess.run([optrace, "report", "-i", str(data), "-f", "json", "--comm", "none"],
                                     capture_output=True, text=True, check=True).stdout)["meta"]
    return shapes, {"stack_quality": meta.get("stack_quality"), "user_stacks": meta.get("user_stacks"),
                    "total_samples": meta.get("total_samples")}


def perf_shapes(data: Path) -> dict[str, Counter]:
    script = subprocess.run(["perf", "script", "--no-inline", "-i", str(data), "--comms", ",".join(COMMS), "-F", "comm,ip,sym,dso"],
                            capture_output=True, text=True).stdout
    shapes: dict[str, Counter] = defaultdict(Counter)
    for block in script.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        comm = lines[0].split()[0]
        user: list[str] = []
        kernel: list[str] = []
        for line in lines[1:]:
            parts = line.split(None, 1)
            if len(parts) < 2:
                continue
            sym, _, dso = parts[1].rpartition(" (")
            name = sym.split("+0x")[0].strip() or "[unknown]"
            if "kernel.kallsyms" in dso or dso.startswith("[") and "vdso" not in dso:
                kernel.append(name)
                continue
            user.append(name)
        shapes[comm][classify(user, kernel)] += 1
    return shapes


def one_run(tool: str, optrace: str | None, loop: str, folder: Path) -> dict:
    data = folder / f"{tool}.data"
    proc = start_loop(folder, loop)
    time.sleep(1.0)
    load = os.getloadavg()[0]
    try:
        if optrace is not None:
            subprocess.run([optrace, "record", "-a", "-F", str(HZ), "-d", str(SECONDS), "-o", str(data)],
                           capture_output=True, check=True, timeout=600)
        else:
            subprocess.run(["perf", "record", "-q", "-a", "-F", str(HZ), "--call-graph", "dwarf", "-o", str(data),
                            "--", "sleep", str(SECONDS)], capture_output=True, check=True, timeout=600)
    finally:
        stop_loop(proc)
    if optrace is not None:
        shapes, header = optrace_shapes(optrace, data)
    else:
        shapes, header = perf_shapes(data), {}
    data.unlink(missing_ok=True)
    result = {"tool": tool, "loop": loop, "load": round(load, 2), "header": header,
              "shapes": {comm: dict(counts) for comm, counts in shapes.items()}}
    print(json.dumps({k: result[k] for k in ("tool", "loop", "load")}), summary_line(result), flush=True)
    return result


def share(counts: dict) -> float | None:
    total = sum(counts.values())
    return round(100.0 * counts.get("complete", 0) / total, 1) if total else None


def summary_line(run: dict) -> str:
    return " ".join(f"{comm} {share(counts)}% of {sum(counts.values())}" for comm, counts in sorted(run["shapes"].items()))


def report(runs: list[dict]) -> None:
    """The markdown section (bench/run.py): per loop, tool and process name, the median share of complete
    stacks and its range over the rounds, and the incomplete samples by shape, summed over the rounds."""
    table: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    shapes: dict[tuple[str, str, str], Counter] = defaultdict(Counter)
    for run in runs:
        for comm, counts in run["shapes"].items():
            if sum(counts.values()) >= 5:
                table[(run["loop"], run["tool"], comm)].append(share(counts))
                shapes[(run["loop"], run["tool"], comm)].update(counts)
    loads = [run["load"] for run in runs]
    print(f"## Short-lived processes' stacks (issue 43 item 1): compile loops, optrace vs perf dwarf\n\n"
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, `bench/bench_compile.py`, load {min(loads)}-{max(loads)}\n")
    rows = [(loop, tool, comm, f"{median(values):.1f}", f"{min(values):.1f}-{max(values):.1f}", len(values),
             ", ".join(f"{k} {v}" for k, v in shapes[(loop, tool, comm)].most_common() if k != "complete"))
            for (loop, tool, comm), values in sorted(table.items())]
    print(md_table(["loop", "tool", "process", "complete % (median)", "range", "runs", "incomplete samples"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loops", default="big,small")
    parser.add_argument("--build", action="append", default=[], help="LABEL=path to an optrace executable")
    parser.add_argument("--no-perf", action="store_true")
    args = parser.parse_args()
    builds = dict(b.split("=", 1) for b in args.build) or {"optrace": str(OPTRACE)}
    tools: list[tuple[str, str | None]] = list(builds.items()) + ([] if args.no_perf else [("perf dwarf", None)])
    runs: list[dict] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="optrace-compile-") as name:
        folder = Path(name)
        make_sources(folder)
        for _ in range(args.rounds):
            for loop in args.loops.split(","):
                for tool, optrace in random.sample(tools, len(tools)):
                    runs.append(one_run(tool, optrace, loop, folder))
                    write_results("compile", {"date": started, "builds": builds, "runs": runs})  # each run kept
    report(runs)


if __name__ == "__main__":
    main()
