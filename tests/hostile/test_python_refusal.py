"""A process refused by the Python walker costs only itself: an unprivileged user's fake CPython 3.11 whose
``_PyRuntime`` is garbage (refused, "layout check failed") spins beside another process of the same fake
binary, one the walker can expand, and a real Python workload of root's; root's ``record -a`` must hand both
of those to the BPF walker and count the refusal once, for the bad process alone.

Found as "one refused process turns the walker off for its whole binary" (test_python_hostile's machine
part); it was not the refusal: a process was looked at for CPython only when its unwind tables came, and on
a busy machine record -a's table workers convert other processes' files for tens of seconds (the walkable
fake alone beside the workload failed the same way).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostilekit import HostileUser, Running, kill_group
from support import perf_event_fds, python_walker_pids
from test_python_hostile import fakes_of, report_json, users_fake_python

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))  # for groundtruth, pythons
from groundtruth import PYGROUND  # noqa: E402
from pythons import require  # noqa: E402

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

# until the walker has the walkable fake and the workload: 5-11 s at load 2-20; before the Python look was
# made when a process's tables are queued (frontend/unwind/scheduler.py), neither within 40 s at load 15-20
WALKED_S = 30
SHAPES = ("garbage", "deep")  # refused; walkable (fakepython.c's modes)


@pytest.fixture(scope="module")
def fake_python(bpf_ready, hostile_user: HostileUser) -> Path:
    return users_fake_python(hostile_user, "pyfake-refusal")


def test_refused_process_costs_only_itself(fake_python, hostile_user: HostileUser, tmp_path):
    script = " ".join(f"{fake_python} {shape} spin &" for shape in SHAPES) + " wait"
    launcher = hostile_user.spawn("sh", "-c", script)
    workload = subprocess.Popen([str(require("3.11-debian")), str(PYGROUND), "--seconds", "300"],
                                stdout=subprocess.DEVNULL)
    data = tmp_path / "refusal.data"
    running = None
    try:
        fakes = fakes_of(launcher, fake_python, shapes=SHAPES)
        wanted = {pid for shape, pid in fakes.items() if shape != "garbage"} | {workload.pid}
        running = Running(["record", "-a", "-F", "199", "-o", str(data)], tmp_path)
        running.wait_attached()
        walked: set[int] = set()
        deadline = time.monotonic() + WALKED_S
        while not wanted <= walked and time.monotonic() < deadline:
            assert running.proc.poll() is None, running.stderr()[-2000:]
            if running.pid and perf_event_fds(running.pid):
                walked = python_walker_pids(running.pid)
            time.sleep(0.2)
    finally:
        run = running.finish(timeout=120, stop_signal=signal.SIGINT) if running else None
        kill_group(launcher)
        workload.kill()
        workload.wait()
    roles = {pid: shape for shape, pid in fakes.items()} | {workload.pid: "workload"}
    assert wanted <= walked, f"the walker did not take {sorted(roles[pid] for pid in wanted - walked)}"
    assert fakes["garbage"] not in walked
    assert run is not None and run.returncode == 0, run.describe()
    interpreters = report_json(data)["meta"]["runtimes"]["cpython"]["processes"]
    assert interpreters.get("refused: layout check failed") == 1, interpreters
