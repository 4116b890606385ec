"""Issue 12 benchmark: `optrace report --format pprof` vs perf's route to a stack profile.

(a) Scale: a record of 100,000 distinct stacks (made in code: depth 10-30 over 2,000 user functions in 8
    objects and 200 kernel functions) written as pprof by `optrace report -f pprof -o` (whole command:
    start-up, reading the record, encoding, gzip) and by the encoder alone (in one process, record
    already read). File size; `go tool pprof -top` must read it.
(b) Same workload, both tools: workloads/build/paths (2^17 distinct call paths) recorded by `optrace record`
    and `perf record -g` at the same frequency; then `optrace report -f pprof` next to `perf report --stdio`
    and `perf script -s stackcollapse.py` (perf's own stackcollapse, the folded input of flame graphs), on
    their own records. Rounds interleave the tools; median and IQR of the command times.
Prints a markdown section on stdout, progress on stderr; writes bench/results/pprof.json. Run as root:
    .venv/bin/python bench/bench_pprof.py [--rounds R]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import OPTRACE, ROOT, WORKLOADS, md_table, median, quartiles, run_timed, write_results  # noqa: E402

BENCH_BUDGET_S = 420  # read by bench/run.py
PYTHON = ROOT / ".venv" / "bin" / "python"
STACKCOLLAPSE = "/usr/lib/perf-core/scripts/python/stackcollapse.py"
STACKS = 100_000
FREQUENCY = 2999
CPU_SECONDS = 6

DRIVER = """
import random, sys, time
from optrace.model import KERNEL_DSO, Frame, Record, RecordMeta, Sample
from optrace.recordfile import read_record, write_record
from optrace.exporters.pprof import encode
if sys.argv[1] == "make":
    rng = random.Random(12)
    dsos = [f"/usr/lib/bench/lib{i}.so" for i in range(8)]
    frames = [Frame(f"fn_{i}_{'x' * (i % 40)}", dsos[i % 8], address=0x1000 + 16 * i, build_id=f"{i % 8:040x}")
              for i in range(2000)]
    frames += [Frame(f"kfn_{i}", KERNEL_DSO, "kernel", address=0xffffffff81000000 + 64 * i) for i in range(200)]
    stacks = set()
    while len(stacks) < int(sys.argv[3]):
        user = tuple(rng.randrange(2000) for _ in range(rng.randint(10, 30)))
        kernel = tuple(2000 + rng.randrange(200) for _ in range(rng.randint(0, 6)))
        stacks.add(kernel + user)
    samples = [Sample(1000 + i % 50, f"comm{i % 50}", s, rng.randint(1, 5)) for i, s in enumerate(sorted(stacks))]
    meta = RecordMeta(optrace_version="bench", hostname="bench", kernel="bench", started=time.time(),
                      duration_s=60.0, frequency_hz=999, event="cpu-clock", total_samples=sum(s.count for s in samples))
    write_record(Record(meta, frames, samples), sys.argv[2])
else:
    record = read_record(sys.argv[2])
    times = []
    for _ in range(int(sys.argv[3])):
        t, c = time.perf_counter(), time.process_time()
        data = encode(record)
        times.append(f"{time.perf_counter() - t},{time.process_time() - c}")
    print(" ".join(times), len(data))
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(argv: list[str], stdout=subprocess.DEVNULL) -> dict[str, float]:
    """Wall and CPU (user + system, wait4) seconds of one command."""
    run = run_timed(argv, stdout=stdout, timeout_s=600)
    if run.returncode != 0:
        raise RuntimeError(f"{argv[0]} {argv[1]} failed with exit status {run.returncode}")
    return {"wall": run.wall_s, "cpu": run.cpu_s}


def spread(values: list[float]) -> str:
    q = quartiles(values)
    return f"{median(values):.2f} s (IQR {q[0]:.2f}-{q[1]:.2f})" if q else f"{median(values):.2f} s"


def both(runs: list[dict[str, float]]) -> list[str]:
    return [spread([run["wall"] for run in runs]), spread([run["cpu"] for run in runs])]


def scale(work: Path, rounds: int) -> dict:
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    record = work / "stacks.data"
    log(f"pprof: making a record of {STACKS} distinct stacks ...")
    subprocess.run([str(PYTHON), str(driver), "make", str(record), str(STACKS)], check=True)
    out = work / "stacks.pb.gz"
    command = [timed([str(OPTRACE), "report", "-i", str(record), "-f", "pprof", "-o", str(out)]) for _ in range(rounds)]
    encoded = subprocess.run([str(PYTHON), str(driver), "encode", str(record), str(rounds)], check=True,
                             capture_output=True, text=True).stdout.split()
    top = subprocess.run(["go", "tool", "pprof", "-top", str(out)], capture_output=True, text=True, timeout=300)
    return {"stacks": STACKS, "record_bytes": record.stat().st_size, "pprof_bytes": out.stat().st_size,
            "command_s": command,
            "encode_s": [dict(zip(("wall", "cpu"), map(float, t.split(",")))) for t in encoded[:-1]], "go_pprof_reads_it": top.returncode == 0}


def distinct_folded(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def same_workload(work: Path, rounds: int) -> dict:
    paths = str(WORKLOADS / "paths")
    optrace_data, perf_data = work / "paths.data", work / "perf.data"
    log(f"pprof: recording paths {CPU_SECONDS} s with optrace and perf at {FREQUENCY} Hz ...")
    subprocess.run([str(OPTRACE), "record", "-F", str(FREQUENCY), "-o", str(optrace_data), "--", paths,
                    str(CPU_SECONDS)], check=True, capture_output=True, timeout=600)
    subprocess.run(["perf", "record", "-F", str(FREQUENCY), "-g", "-o", str(perf_data), "--", paths,
                    str(CPU_SECONDS)], check=True, capture_output=True, timeout=600)
    pprof_out, folded_out = work / "paths.pb.gz", work / "perf.folded"
    times: dict[str, list[dict[str, float]]] = {"optrace report -f pprof": [], "perf report --stdio": [],
                                     "perf script -s stackcollapse.py": []}
    for _ in range(rounds):
        times["optrace report -f pprof"].append(
            timed([str(OPTRACE), "report", "-i", str(optrace_data), "-f", "pprof", "-o", str(pprof_out)]))
        times["perf report --stdio"].append(timed(["perf", "report", "--stdio", "-i", str(perf_data)]))
        with folded_out.open("w") as sink:
            times["perf script -s stackcollapse.py"].append(
                timed(["perf", "script", "-i", str(perf_data), "-s", STACKCOLLAPSE], stdout=sink))
    folded = subprocess.run([str(OPTRACE), "report", "-i", str(optrace_data), "-f", "folded"], check=True,
                            capture_output=True, text=True).stdout
    return {"times": times, "optrace_record_bytes": optrace_data.stat().st_size, "perf_data_bytes": perf_data.stat().st_size,
            "pprof_bytes": pprof_out.stat().st_size, "perf_folded_bytes": folded_out.stat().st_size,
            "optrace_stacks": distinct_folded(folded), "perf_stacks": distinct_folded(folded_out.read_text())}


def targets(res: dict) -> list[dict]:
    """Issue 12: pprof write ≤ 1 s, judged on the encoder's CPU time (wall time follows the machine's load)
    and shown for the whole command too (which also reads the record)."""
    encode_cpu = median([run["cpu"] for run in res["scale"]["encode_s"]])
    command = res["scale"]["command_s"]
    command_wall, command_cpu = median([run["wall"] for run in command]), median([run["cpu"] for run in command])
    return [{"name": "pprof: encode 100,000 distinct stacks", "target": "≤ 1 s",
             "measured": f"{encode_cpu:.2f} s CPU", "met": encode_cpu <= 1.0},
            {"name": "pprof: `report -f pprof -o` of 100,000 stacks (reading the record included)", "target": "≤ 1 s",
             "measured": f"{command_wall:.2f} s wall, {command_cpu:.2f} s CPU", "met": command_wall <= 1.0}]


def markdown(res: dict) -> str:
    a, b = res["scale"], res["same_workload"]
    kib = lambda n: f"{n / 1024:,.0f} KiB"  # noqa: E731
    lines = ["## pprof output (issue 12)", "",
             f"### (a) {a['stacks']:,} distinct stacks, written as pprof ({res['rounds']} runs; target: write ≤ 1 s)", "",
             md_table(["what", "wall time", "CPU time", "size"], [
                 ["`optrace report -f pprof -o` (whole command)", *both(a["command_s"]), kib(a["pprof_bytes"])],
                 ["pprof encoder alone (record already read)", *both(a["encode_s"]), ""],
                 ["the record file it reads", "", "", kib(a["record_bytes"])],
             ]), "", f"`go tool pprof -top` reads it: {'yes' if a['go_pprof_reads_it'] else 'NO'}.", "",
             f"### (b) Same workload (`paths`, {CPU_SECONDS} s CPU at {FREQUENCY} Hz), each tool on its own record", "",
             md_table(["command", "wall time", "CPU time"], [[f"`{name}`", *both(runs)] for name, runs in b["times"].items()]),
             "", md_table(["file", "size", "distinct stacks"], [
                 ["optrace record", kib(b["optrace_record_bytes"]), f"{b['optrace_stacks']:,}"],
                 ["its pprof (.pb.gz)", kib(b["pprof_bytes"]), ""],
                 ["perf.data", kib(b["perf_data_bytes"]), f"{b['perf_stacks']:,}"],
                 ["perf's folded stacks", kib(b["perf_folded_bytes"]), ""],
             ]), "",
             "Measured while other engineers' tests and benchmarks ran on the same 2-vCPU machine: times are"
             " medians of interleaved rounds with their interquartile range; CPU time (user + system) is the figure"
             " that load changes least.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="optrace-bench-pprof-") as tmp:
        work = Path(tmp)
        res = {"rounds": args.rounds, "scale": scale(work, args.rounds), "same_workload": same_workload(work, args.rounds)}
    res["targets"] = targets(res)
    write_results("pprof", res)
    print(markdown(res))


if __name__ == "__main__":
    main()
