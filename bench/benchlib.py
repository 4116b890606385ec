"""Helpers shared by the bench/bench_*.py scripts and bench/run.py.

Kept free of optrace imports: a benchmark drives optrace and the reference tools as separate processes,
the way a user runs them, and measures them from the outside (wall time, CPU time and peak RSS from
wait4, perf-event file descriptors from /proc).
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OPTRACE = ROOT / ".venv" / "bin" / "optrace"
WORKLOADS = ROOT / "workloads" / "build"
PERF_EVENT_FD = "anon_inode:[perf_event]"


def _default_signals() -> None:
    """Child set-up: a harness started in the background inherits SIGINT ignored, and then a tool
    (perf, BCC's profile, optrace) would never see the Ctrl-C that tells it to stop and write."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass
class ToolRun:
    """What a finished process cost, measured from outside."""

    returncode: int
    wall_s: float
    cpu_s: float  # user + system of the process and the children it waited for
    maxrss_kb: int  # peak RSS of its largest process (wait4: exact, never misses a short spike)
    tree_rss_kb: int  # peak RSS of its process tree (polled every 50 ms, see Launched._poll_rss)
    processes: int  # processes seen in its tree (itself included)


def first_in_line() -> None:
    """Child set-up: the process runs at nice -20 in an autogroup of its own at nice -20 (the kernel
    balances CPU between autogroups before nice values count), so a busy shared machine takes little of its
    CPU."""
    os.setsid()
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("-20")
    except OSError:
        pass
    os.nice(-20)


def optrace_system_wide_fds() -> int:
    """The perf events `optrace record -a` holds once sampling: its exec and exit tracepoints, a perf
    buffer per CPU, then the sampler's event per CPU. The sampler comes last and, since the busiest
    processes' unwind tables load before it (SessionMode.unwind_busy_first), up to seconds after the
    rest: waiting for a count that stays put would start the window before sampling does."""
    return 2 + 2 * (os.cpu_count() or 1)


@dataclass
class Launched:
    """A process started by the benchmark: its tree's RSS is polled until it is reaped."""

    popen: subprocess.Popen
    started: float
    _tree_peak_kb: int = 0
    _seen: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _poller: threading.Thread | None = None

    @classmethod
    def start(cls, argv: Sequence[str | os.PathLike], stdin=None, stdout: int | IO | None = subprocess.DEVNULL,
              stderr: int | IO | None = subprocess.PIPE, cwd: Path | None = None) -> "Launched":
        started = time.monotonic()
        popen = subprocess.Popen([str(a) for a in argv], stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd,
                                 preexec_fn=_default_signals)
        launched = cls(popen=popen, started=started)
        launched._poller = threading.Thread(target=launched._poll_rss, daemon=True)
        launched._poller.start()
        return launched

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _poll_rss(self) -> None:
        """Peak over polls of: the tool's own VmHWM + the VmRSS of its other processes. A descendant
        still running the tool's own executable (forked, not yet exec'd: subprocess's vfork window)
        shares the tool's pages and is not counted again."""
        root_exe = read_exe(self.pid)
        while not self._stop.is_set():
            tree = process_tree(self.pid)
            others = [pid for pid in tree[1:] if read_exe(pid) != root_exe]
            total = read_status_kb(self.pid, "VmHWM") + sum(read_status_kb(pid, "VmRSS") for pid in others)
            self._tree_peak_kb = max(self._tree_peak_kb, total)
            self._seen.update(others)
            self._stop.wait(0.05)

    def perf_event_fds(self) -> int:
        """Open perf events in the tree: a sampling profiler is attached once these exist."""
        return sum(count_fds(pid, PERF_EVENT_FD) for pid in process_tree(self.pid))

    def wait_attached(self, settle_s: float = 0.5, timeout_s: float = 60.0, min_count: int = 1) -> float:
        """Wait until the tree holds at least ``min_count`` perf events and their number has not changed for
        settle_s; returns the time from launch to the last change (when the profiler finished attaching)."""
        deadline = time.monotonic() + timeout_s
        count, changed = 0, time.monotonic()
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.popen.args[0]} exited with status {self.popen.returncode} before attaching")
            now_count = self.perf_event_fds()
            if now_count != count:
                count, changed = now_count, time.monotonic()
            elif count >= min_count and time.monotonic() - changed >= settle_s:
                return changed - self.started
            time.sleep(0.01)
        raise TimeoutError(f"{self.popen.args[0]} did not attach within {timeout_s:.0f} s")

    def interrupt(self) -> None:
        if self.popen.returncode is None:
            os.kill(self.pid, signal.SIGINT)

    def finish(self, timeout_s: float = 120.0) -> ToolRun:
        """Reap the process (killing it after timeout_s) and return what it cost."""
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.02)
        wall = time.monotonic() - self.started
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        self._stop.set()
        self._poller.join()
        return ToolRun(
            returncode=self.popen.returncode,
            wall_s=wall,
            cpu_s=usage.ru_utime + usage.ru_stime,
            maxrss_kb=usage.ru_maxrss,
            tree_rss_kb=self._tree_peak_kb,
            processes=1 + len(self._seen),
        )


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (through /proc/PID/task/TID/children)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return tree


def read_exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def read_status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def count_fds(pid: int, target: str) -> int:
    count = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                count += os.readlink(f"/proc/{pid}/fd/{fd}") == target
            except OSError:
                continue
    except OSError:
        pass
    return count


def run_timed(argv: Sequence[str | os.PathLike], stdout: int | IO = subprocess.DEVNULL,
              timeout_s: float = 300.0) -> ToolRun:
    launched = Launched.start(argv, stdout=stdout, stderr=subprocess.DEVNULL)
    return launched.finish(timeout_s)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def quartiles(values: Sequence[float]) -> tuple[float, float] | None:
    """First and third quartile (inclusive method); None below two values."""
    if len(values) < 2:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join("" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(area: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{area}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def command_output(argv: Sequence[str], default: str = "not found") -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return default
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else default


def provenance(argv: Sequence[str]) -> str:
    """When, at which commit and with which command a figure was made (for the figure's own text)."""
    commit = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], "unknown")
    dirty = command_output(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":!bench/outcomes", ":!bench/README.md"], "")  # bench/run.py writes those first
    script = next(i for i, arg in enumerate(argv) if arg.endswith(".py"))  # after any VARIABLE=value
    command = " ".join([*argv[:script], ".venv/bin/python", str(Path(argv[script]).resolve().relative_to(ROOT)),
                        *argv[script + 1:]])
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}"
            f"{' (with uncommitted changes)' if dirty else ''}, `{command}`")


def machine_info() -> dict[str, str]:
    """The facts a reader needs to judge the numbers: hardware, kernel, load, tool versions."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        distro = next(line.split("=", 1)[1].strip('"') for line in Path("/etc/os-release").read_text().splitlines()
                      if line.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        distro = "unknown"
    return {
        "cpu": f"{cpu} ({os.cpu_count()} CPUs)",
        "memory": f"{mem_gib:.1f} GiB",
        "os": distro,
        "kernel": platform.release(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "perf": command_output(["perf", "--version"]),
        "bcc (python3-bpfcc)": command_output(["dpkg-query", "-W", "-f=${Version}", "python3-bpfcc"]),
        "optrace": command_output([str(OPTRACE), "--version"]),
        "pmu": "none (cpu-clock software event)" if not Path("/sys/bus/event_source/devices/cpu").exists()
        else "present",
    }



# -- BPF programs' own run time (kernel.bpf_stats_enabled) ------------------------------------------------

# An optrace sample's programs: on_sample and the walkers it tail-calls, whose time the kernel counts in
# on_sample's run (a tail call is no run of its own: their run_cnt stays 0)
SAMPLE_PROGRAMS = ("on_sample", "unwind_step", "python_step", "python_thread", "python_capture")


@contextmanager
def bpf_stats_enabled() -> Iterator[None]:
    """BPF programs' run time counted (run_time_ns, run_cnt) during the block, through a BPF_ENABLE_STATS
    fd: the kernel counts it with kernel.bpf_stats_enabled, so another run setting the sysctl back to 0
    meanwhile does not turn the counting off (nor does the block change what the sysctl says)."""
    attr = ctypes.create_string_buffer(4)  # union bpf_attr's enable_stats.type: BPF_STATS_RUN_TIME (0)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(321, 32, attr, len(attr))  # SYS_bpf, BPF_ENABLE_STATS
    if fd < 0:
        raise OSError(ctypes.get_errno(), "BPF_ENABLE_STATS")
    try:
        yield
    finally:
        os.close(fd)


def held_bpf_ids(pid: int, kind: str) -> set[int]:
    """The ids of the BPF objects (``kind``: "prog" or "map") a process holds, from its fds' fdinfo."""
    ids = set()
    try:
        entries = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return ids
    for fd in entries:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                found = re.search(rf"^{kind}_id:\s*(\d+)", f.read(), re.M)
        except OSError:
            continue
        if found:
            ids.add(int(found.group(1)))
    return ids


def bpf_run_stats(pid: int) -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) of the BPF programs a process holds, summed by program name (bpftool)."""
    ids = held_bpf_ids(pid, "prog")
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True, check=True).stdout
    stats: dict[str, tuple[int, int]] = {}
    for prog in json.loads(out):
        if prog["id"] in ids:
            ns, runs = stats.get(prog.get("name", ""), (0, 0))
            stats[prog.get("name", "")] = (ns + prog.get("run_time_ns", 0), runs + prog.get("run_cnt", 0))
    return stats


def bpf_ns_per_sample(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> float | None:
    """An optrace process's BPF run time per sample between two bpf_run_stats (None: no sample)."""
    runs = after.get("on_sample", (0, 0))[1] - before.get("on_sample", (0, 0))[1]
    ns = sum(after.get(name, (0, 0))[0] - before.get(name, (0, 0))[0] for name in SAMPLE_PROGRAMS)
    return ns / runs if runs > 0 else None


def bpf_map_keys(pid: int, name: str) -> set[int]:
    """The keys (u32, u64: little-endian integers) of the BPF map called ``name`` that a process holds:
    e.g. optrace's unwind_procs and py_procs, the processes its CFI and Python walkers have."""
    for map_id in held_bpf_ids(pid, "map"):
        shown = subprocess.run(["bpftool", "map", "show", "id", str(map_id), "-j"], capture_output=True, text=True)
        if shown.returncode or json.loads(shown.stdout).get("name") != name:
            continue
        dumped = subprocess.run(["bpftool", "map", "dump", "id", str(map_id), "-j"], capture_output=True, text=True)
        return {int.from_bytes(bytes(int(b, 16) for b in entry["key"]), "little")
                for entry in json.loads(dumped.stdout or "[]")}
    return set()


def source_state() -> str:
    """The commit measured, and whether the tree differed from it (e.g. "574b3a8 + uncommitted changes"); the
    harness's own outputs (bench/README.md, bench/outcomes/, written as it runs) do not count."""
    commit = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], "unknown")
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":!bench/README.md", ":!bench/outcomes"], capture_output=True, text=True).stdout.strip()
    return f"{commit} + uncommitted changes" if dirty else commit
