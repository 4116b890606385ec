"""What stands between launch and the first sample (issue 36): a CPU-bound process with seconds left is
recorded from almost its launch on a machine whose CPUs are all busy; what is not needed to sample waits
for the sampler's attach; the raised start priority is given back. Real runs."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from optrace.frontend import startpriority
from support import OPTRACE, run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")

HZ = 999
LEFT_S = 2.5  # of the target's own CPU time when the recording is launched
BURN = "import time\nend = time.process_time() + {left}\nwhile time.process_time() < end:\n    pass\n"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Hogs:
    """A busy loop per CPU, at normal priority, for the block."""

    def __enter__(self) -> "Hogs":
        self.procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)]
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def test_a_busy_process_with_seconds_left_is_recorded_from_its_launch(tmp_path):
    """The acceptance of issue 36: with every CPU busy, `record -p` of a CPU-bound process that has 2.5 s of
    CPU left has >= 90 % of the samples its remaining CPU time makes at 999 Hz (before the stored programs,
    it took 0 samples of such a process, attaching after it was gone)."""
    out = tmp_path / "r.data"
    run_optrace("record", "-o", str(out), "--", "true", check=True)  # the programs stored, as on a machine that ran optrace
    with Hogs():
        target = subprocess.Popen([sys.executable, "-c", BURN.format(left=LEFT_S + 0.3)])
        time.sleep(0.3)  # its interpreter started: it burns from here on
        before = cpu_seconds(target.pid)
        record = subprocess.run([str(OPTRACE), "record", "-F", str(HZ), "-p", str(target.pid), "-o", str(out)],
                                capture_output=True, text=True, timeout=120)
        _, status, usage = os.wait4(target.pid, 0)
    assert record.returncode == 0 and status == 0, record.stderr
    remaining = usage.ru_utime + usage.ru_stime - before
    samples = int(record.stderr.rsplit("optrace record: ", 1)[1].split(" samples", 1)[0])
    assert samples >= 0.9 * remaining * HZ, (samples, remaining, record.stderr)


def test_nothing_but_the_sampler_comes_before_its_attach(monkeypatch):
    """The kernel symbols and the target's unwind tables load once the sampler is attached (they took the
    interpreter and a CPU from the start before; the programs were compiled meanwhile)."""
    from optrace.bpf.profiler import Profiler
    from optrace.frontend import session as session_module
    from optrace.frontend.session import RECORD, ProfilingSession, SessionOptions
    from optrace.frontend.unwind.scheduler import UnwindScheduler

    order: list[str] = []
    attach, symbols, tables = Profiler.attach, session_module.KernelSymbolsLoader.__init__, UnwindScheduler.unwind

    def spy(name, call):
        def spied(*args, **kwargs):
            order.append(name)
            return call(*args, **kwargs)
        return spied

    monkeypatch.setattr(Profiler, "attach", spy("attach", attach))
    monkeypatch.setattr(session_module.KernelSymbolsLoader, "__init__", spy("kernel symbols", symbols))
    monkeypatch.setattr(UnwindScheduler, "unwind", spy("unwind tables", tables))
    target = subprocess.Popen(["sleep", "30"])
    try:
        with ProfilingSession(SessionOptions(RECORD, pids=[target.pid])) as session:
            session.unwinder._unwind_worker.submit(lambda: None).result()  # the worker's jobs so far are done
    finally:
        target.kill()
        target.wait()
    assert order[0] == "attach" and {"kernel symbols", "unwind tables"} <= set(order), order


def thread_nices(pid: int) -> dict[int, int]:
    nices = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            nices[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, IndexError, ValueError):
            pass
    return nices


def test_the_raised_start_priority_is_given_back_to_every_thread():
    """Raised from the launch until attached, then every thread at the nice the process started with,
    those started while it was raised too."""
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0
    assert startpriority.raise_for_start()
    raised = {}
    thread = threading.Thread(target=lambda: (raised.setdefault("nice", os.getpriority(os.PRIO_PROCESS, 0)),
                                              time.sleep(0.5)))
    thread.start()
    time.sleep(0.1)
    startpriority.start_done()
    after = thread_nices(os.getpid())
    thread.join()
    assert raised["nice"] == startpriority.START_NICE
    assert set(after.values()) == {0}, after
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0


def test_a_lowered_priority_is_left_alone():
    child = subprocess.run([sys.executable, "-c", "import os\nos.nice(5)\nfrom optrace.frontend import startpriority"
                            "\nprint(startpriority.raise_for_start(), os.getpriority(os.PRIO_PROCESS, 0))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.split() == ["False", "5"]


def test_the_recording_and_its_command_run_at_the_users_priority(tmp_path):
    """record's threads once sampling, and the command it starts, are at nice 0 (the command is forked after
    the start priority is given back)."""
    out = tmp_path / "r.data"
    proc = subprocess.Popen([str(OPTRACE), "record", "-o", str(out), "--", sys.executable, "-c",
                             "import os, time\nprint(os.getpriority(os.PRIO_PROCESS, 0), flush=True)\ntime.sleep(1)"],
                            stdout=subprocess.PIPE, text=True)
    command_nice = proc.stdout.readline().strip()
    recording = thread_nices(proc.pid)
    proc.wait(timeout=60)
    assert command_nice == "0"
    assert set(recording.values()) == {0}, recording
