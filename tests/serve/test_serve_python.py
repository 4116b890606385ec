"""`optrace serve` names a Python process's CPU series after its Python functions (issue 41: the hottest series
of a pure-Python job on Debian's stripped python3.11 was ``symbol="python3.11+0x10a500"``), and after the
interpreter's own code with --python-internals, as recorded."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from serve.test_serve_bpf import CPU, start_serve, wait_for, wait_for_drains
from support import REPO, first_in_line

pytestmark = [pytest.mark.bpf, pytest.mark.slow]
PYTHON = Path("/usr/bin/python3.11")
CALLEES = REPO / "tests" / "python" / "programs" / "callees.py"
WINDOW_DRAINS = 4


@pytest.fixture
def python_job():
    if not PYTHON.exists():
        pytest.skip("Debian's python3.11 is not installed")
    job = subprocess.Popen([str(PYTHON), str(CALLEES), "300", "--wall"], stdout=subprocess.DEVNULL,
                           preexec_fn=first_in_line)
    yield job
    job.kill()
    job.wait()


def series_increase(serve, expo, job: subprocess.Popen) -> dict[tuple[str, str], float]:
    """(dso, symbol) -> the job's CPU seconds over WINDOW_DRAINS drains, once its Python frames are named."""
    wait_for(lambda: any(dict(key)["dso"] == str(CALLEES) for key in expo.samples(expo.scrape(serve.url), CPU)),
             60, "a series of the job's Python functions")
    before = expo.samples(expo.scrape(serve.url), CPU)
    wait_for_drains(serve.url, expo, WINDOW_DRAINS)
    after = expo.samples(expo.scrape(serve.url), CPU)
    return {(dict(key)["dso"], dict(key)["symbol"]): value - before.get(key, 0.0) for key, value in after.items()
            if dict(key)["comm"] == job.args[0].rsplit("/", 1)[-1] and value > before.get(key, 0.0)}


def test_a_python_process_series_are_its_python_functions(bpf_ready, python_job, tmp_path, expo):
    serve = start_serve(["-F", "499", "-p", str(python_job.pid)], tmp_path)
    try:
        seconds = series_increase(serve, expo, python_job)
    finally:
        assert serve.stop() == 0
    hottest = max(seconds, key=seconds.__getitem__)
    assert hottest in {(str(CALLEES), "parse"), (str(CALLEES), "split_words")}, seconds
    interpreter = sum(value for (dso, _), value in seconds.items() if dso == str(PYTHON))
    assert interpreter <= 0.1 * sum(seconds.values()), seconds


def test_python_internals_names_the_interpreters_code(bpf_ready, python_job, tmp_path, expo):
    serve = start_serve(["-F", "499", "-p", str(python_job.pid), "--python-internals"], tmp_path)
    try:
        seconds = series_increase(serve, expo, python_job)
    finally:
        assert serve.stop() == 0
    interpreter = sum(value for (dso, _), value in seconds.items() if dso == str(PYTHON))
    assert interpreter >= 0.3 * sum(seconds.values()), seconds
