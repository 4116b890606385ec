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
