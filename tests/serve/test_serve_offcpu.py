"""`optrace serve --off-cpu`: optrace_offcpu_seconds_total on a workload copied under a name of its own
(the whole machine is measured), by the frame each thread waits in; the cardinality guard holds it too."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from support import bpf_prog_ids
from serve.test_serve_bpf import start_serve, wait_for, wait_for_drains

OFFCPU = "optrace_offcpu_seconds_total"
pytestmark = [pytest.mark.bpf, pytest.mark.slow, pytest.mark.usefixtures("bpf_ready")]


def test_off_cpu_seconds_by_where_threads_wait(tmp_path, workloads, expo):
    program = tmp_path / "offcpu_srv"
    shutil.copy(workloads / "offcpu", program)
    served = start_serve(["--off-cpu", "--comm", "sleeper", "--comm", "pipe_reader", "--comm", "offcpu_srv"], tmp_path)
    try:
        run = subprocess.run([str(program), "1"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0
        timings = json.loads(run.stderr.splitlines()[-1])  # the workload's own clocks
        wait_for_drains(served.url, expo)  # every wait of the workload is in the counters then

        def waited() -> dict:
            """comm -> {symbol: seconds} (a wait whose user stack was lost to a stack-map collision is
            named by its kernel frame instead: the machine-wide stack maps are shared by every process)."""
            by_comm: dict[str, dict[str, float]] = {}
            for labels, seconds in expo.samples(expo.scrape(served.url), OFFCPU).items():
                labels = dict(labels)
                by_comm.setdefault(labels["comm"], {})[labels["symbol"]] = seconds
            return by_comm if {"sleeper", "pipe_reader"} <= set(by_comm) else {}

        by_comm = wait_for(waited, 30, "off-CPU series of the workload")
        sleeper, reader = by_comm["sleeper"], by_comm["pipe_reader"]
        assert max(sleeper, key=sleeper.get) == "clock_nanosleep"
        assert sum(sleeper.values()) == pytest.approx(timings["sleeper"]["blocked"], rel=0.05, abs=0.02)
        assert max(reader, key=reader.get) == "read" and reader["read"] >= 0.8 * sum(reader.values())
        own = timings["pipe_reader"]
        assert own["blocked"] - 0.02 <= sum(reader.values()) <= own["lifetime"] - own["cpu"] + 0.02
        page = expo.scrape(served.url)
        assert f"# TYPE {OFFCPU} counter" in page
        assert f'optrace_series{{metric="{OFFCPU}"}}' in page
        assert bpf_prog_ids(served.process.pid)
    finally:
        assert served.stop() == 0


def test_off_cpu_series_are_bounded(tmp_path, expo):
    """--max-series 3 over the whole machine: one series, the coarse [other] and the catch-all at most."""
    served = start_serve(["--off-cpu", "--max-series", "3"], tmp_path)
    try:
        def many() -> dict:
            series = expo.samples(expo.scrape(served.url), OFFCPU)
            return series if any(dict(labels)["symbol"] == "[other]" for labels in series) else {}

        series = wait_for(many, 30, "[other] off-CPU series")
        assert len(series) <= 3
        assert 'optrace_cardinality_overflow_total{metric="optrace_offcpu_seconds_total"}' in expo.scrape(served.url)
    finally:
        assert served.stop() == 0


SLEEPS = """
import ctypes, json, sys, time
ctypes.CDLL(None).prctl(15, b"sleeps_srv", 0, 0, 0)  # PR_SET_NAME: a comm no other process has
total = 0.0
for _ in range(int(sys.argv[1])):
    start = time.perf_counter()
    time.sleep(0.0005)
    total += time.perf_counter() - start
print(json.dumps({"slept": total}))
"""


def test_off_cpu_every_estimates_the_seconds(tmp_path, expo):
    """serve --off-cpu-every 4 on Debian's python3 sleeping 2000 x 0.5 ms: its clock_nanosleep series is an
    estimate of the sleeps' own clock (one wait in 4 counted 4 times: 3 standard deviations are ~13 %), and
    each of its series a whole multiple of 4 ns."""
    script = tmp_path / "sleeps.py"
    script.write_text(SLEEPS)
    served = start_serve(["--off-cpu", "--off-cpu-every", "4", "--comm", "sleeps_srv"], tmp_path)
    try:
        run = subprocess.run(["python3", str(script), "2000"], capture_output=True, text=True, timeout=120, check=True)
        slept = json.loads(run.stdout)["slept"]
        wait_for_drains(served.url, expo)

        def sleeps() -> float:
            series = expo.samples(expo.scrape(served.url), OFFCPU)
            return sum(seconds for labels, seconds in series.items()
                       if dict(labels) == {"comm": "sleeps_srv", "dso": dict(labels)["dso"], "symbol": "clock_nanosleep"})

        assert wait_for(sleeps, 30, "the sleeps' series") == pytest.approx(slept, rel=0.25)
        ours = [seconds for labels, seconds in expo.samples(expo.scrape(served.url), OFFCPU).items()
                if dict(labels)["comm"] == "sleeps_srv"]
        assert all(round(seconds * 1e9) % 4 == 0 for seconds in ours), ours  # sums of waits counted 4 times
    finally:
        assert served.stop() == 0
