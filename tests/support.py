"""Helpers shared by tests (importable as `support`: pytest's pythonpath includes tests/)."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # the benchmarks' measuring helpers, shared with the tests
from benchlib import (bpf_map_keys, bpf_ns_per_sample, bpf_run_stats, bpf_stats_enabled, first_in_line,  # noqa: E402,F401
                      held_bpf_ids)
WORKLOADS = REPO / "workloads" / "build"
OPTRACE = Path(sys.executable).parent / "optrace"
IN_CI = os.environ.get("CI", "").lower() == "true"


def run_optrace(*args: str, check: bool = False, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would, capturing text output."""
    proc = subprocess.run(
        [str(OPTRACE), *args], capture_output=True, text=True, timeout=timeout, **kw
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"optrace {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def perf_event_fds(pid: int) -> int:
    """How many perf events a process holds open (a sampler holds one or more per CPU once attached); 0
    once it is gone."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return 0
    count = 0
    for fd in fds:
        try:
            count += os.readlink(fd) == "anon_inode:[perf_event]"
        except OSError:
            pass
    return count


def wait_perf_events(pid: int, count: int, timeout: float = 60.0) -> float:
    """Wait until the process holds ``count`` perf events; the time it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if perf_event_fds(pid) >= count:
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never opened {count} perf events")


def run_as_nobody(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command as user nobody (uid/gid 65534, no groups)."""
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv],
        capture_output=True, text=True, timeout=timeout,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input: non-zero exit, exactly one line on stderr, no traceback."""
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def bpf_programs_named(name: str) -> dict[int, set[int]]:
    """Loaded BPF programs called `name`, each with the pids holding an fd to it (from /proc/*/fdinfo)."""
    import json

    listing = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True, check=True)
    ids = {p["id"] for p in json.loads(listing.stdout) if p.get("name") == name}
    holders: dict[int, set[int]] = {i: set() for i in ids}
    for fdinfo in Path("/proc").glob("[0-9]*/fdinfo/*"):
        try:
            text = fdinfo.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("prog_id:") and int(line.split()[1]) in holders:
                holders[int(line.split()[1])].add(int(fdinfo.parts[2]))
    return holders


ORPHAN_RECHECK_S = 2.0


def assert_no_programs_of(pid: int, name: str) -> None:
    """Nothing a (now exited) optrace process loaded is still there: no program of its, no orphan. An orphan
    is one still unheld ORPHAN_RECHECK_S later: another optrace exiting while the fds are read holds its
    program through none for a moment (on a shared machine, 2 of 2 sigterm runs of tests/top at load 30)."""
    orphans = set()
    for prog_id, pids in bpf_programs_named(name).items():
        assert pid not in pids, f"program {prog_id} still held by {pid}"
        if not pids:
            orphans.add(prog_id)
    if orphans:
        time.sleep(ORPHAN_RECHECK_S)
        still = sorted(i for i, pids in bpf_programs_named(name).items() if i in orphans and not pids)
        assert not still, f"programs {still} ({name}) are loaded but held by no process"


def bpf_prog_ids(pid: int) -> set[int]:
    """BPF programs a process holds open (from its fds' fdinfo)."""
    return held_bpf_ids(pid, "prog")


def python_walker_pids(holder: int) -> set[int]:
    """The processes whose Python frames the BPF walker of optrace process ``holder`` expands (the keys of
    its py_procs map, bpf/python_walk.h)."""
    return bpf_map_keys(holder, "py_procs")


def verified_instructions(prog_fd: int) -> tuple[str, int]:
    """(name, instructions the verifier processed) of a loaded BPF program, from the kernel's struct
    bpf_prog_info (BPF_OBJ_GET_INFO_BY_FD; verified_insns since Linux 5.16)."""
    import ctypes

    info = ctypes.create_string_buffer(232)  # up to attach_btf_id, the layout of include/uapi/linux/bpf.h
    attr = ctypes.create_string_buffer(16)
    ctypes.memmove(attr, (ctypes.c_uint32 * 2)(prog_fd, len(info)), 8)
    ctypes.memmove(ctypes.addressof(attr) + 8, ctypes.byref(ctypes.c_uint64(ctypes.addressof(info))), 8)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(321, 15, attr, len(attr)) != 0:  # SYS_bpf, BPF_OBJ_GET_INFO_BY_FD
        raise OSError(ctypes.get_errno(), "BPF_OBJ_GET_INFO_BY_FD")
    name = info.raw[64:80].split(b"\0")[0].decode()
    return name, int.from_bytes(info.raw[216:220], "little")


def loaded_prog_ids() -> set[int]:
    """Every BPF program loaded on the machine."""
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True, check=True).stdout
    return {prog["id"] for prog in json.loads(out)}


def still_loaded(prog_ids: set[int], within_s: float = 2.0) -> set[int]:
    """Which of ``prog_ids`` are still loaded ``within_s`` after their holders closed them: the kernel frees a
    closed program after an RCU grace period, a fraction of a second later on a loaded machine."""
    deadline = time.monotonic() + within_s
    while (left := prog_ids & loaded_prog_ids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@contextmanager
def running(argv: list[str]) -> Iterator[subprocess.Popen]:
    """A process for the duration of the block, killed and reaped afterwards."""
    proc = subprocess.Popen(argv)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def system_user(name: str) -> Iterator[pwd.struct_passwd]:
    """An unprivileged account for tests: created if missing (and then removed at the end), reused if not."""
    created = False
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name], check=True)
        entry, created = pwd.getpwnam(name), True
    try:
        yield entry
    finally:
        if created:
            subprocess.run(["userdel", name], check=False)


def leaf_samples(record, comm: str) -> Counter[str]:
    """Samples per leaf symbol of ``comm``'s samples in a Record (``[unknown]`` for a stackless one)."""
    leaves: Counter[str] = Counter()
    for sample in record.samples:
        if sample.comm == comm:
            leaves[record.frames[sample.frames[0]].symbol if sample.frames else "[unknown]"] += sample.count
    return leaves


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, its ended threads' included (utime + stime of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sleep_until_cpu(pid: int, seconds: float, limit_s: float) -> float:
    """Sleep until process ``pid`` has used ``seconds`` more CPU time (cpu-clock samples follow CPU time, so
    that many seconds × Hz samples are in), or ``limit_s`` has passed (a starved process gets the old fixed
    window). Returns the CPU time it used."""
    start, deadline = cpu_seconds(pid), time.monotonic() + limit_s
    while (used := cpu_seconds(pid) - start) < seconds and time.monotonic() < deadline:
        time.sleep(0.05)
    return used
