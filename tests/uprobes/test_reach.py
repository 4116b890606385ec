"""How many processes a uprobe slows down (frontend/uprobes/reach.py): every process that maps the probed
file, counted from /proc, with the processes started here as the ground truth."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from optrace.frontend.uprobes.reach import slowed_processes
from optrace.frontend.uprobes.resolve import ProbeKey, ResolvedProbe
from optrace.procfs import processes_mapping


def probe_on(path: Path, symbol: str = "main") -> ResolvedProbe:
    st = os.stat(path)
    return ResolvedProbe(spec=f"{path}:{symbol}", binary=str(path), symbol=symbol, offset=0x1000,
                         key=ProbeKey(st.st_dev, st.st_ino, 0x1000))


def test_the_processes_that_map_a_file_are_counted(tmp_path):
    program = tmp_path / "mysleep"  # a file of its own: only the processes started here map it
    shutil.copy2("/usr/bin/sleep", program)
    key = (os.stat(program).st_dev, os.stat(program).st_ino)
    assert processes_mapping({key}) == {key: 0} and slowed_processes([probe_on(program)]) == []
    sleepers = [subprocess.Popen([str(program), "30"]) for _ in range(3)]
    try:
        assert processes_mapping({key}) == {key: 3}
        assert processes_mapping({key}, skip=sleepers[0].pid) == {key: 2}
        warnings = slowed_processes([probe_on(program, "main"), probe_on(program, "usage")])
        assert warnings == [f"--uprobe {program}:main, {program}:usage: 3 other processes map {program} now: every "
                            "call of main, usage in them (and in those that map it later) traps into the kernel, a few "
                            "microseconds each, whatever -p and --comm count"]
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_libc_is_mapped_by_nearly_every_process():
    libc = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    key = (os.stat(libc).st_dev, os.stat(libc).st_ino)
    by_text = sum(1 for pid in os.listdir("/proc") if pid.isdigit() and _maps_mention(pid, str(libc)))
    assert abs(processes_mapping({key})[key] - by_text) <= 2  # processes come and go between the two counts
    (warning,) = slowed_processes([probe_on(libc, "malloc")])
    assert f"other processes map {libc} now: every call of malloc" in warning


def _maps_mention(pid: str, path: str) -> bool:
    try:
        return path in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
