"""The hostile local user of issue 8, and root's optrace measured while it acts.

An unprivileged account builds its own programs and files (owned by it, in a folder it owns), runs them
as CPU burners so that root's whole-machine ``optrace record -a`` / ``optrace serve`` meets them, and
plants files. Root's optrace runs are measured: wall time, peak RSS (GNU time's, see :class:`Running`),
the BPF programs it held, its exit status and output.
"""
from __future__ import annotations

import os
import re
import secrets
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from support import bpf_prog_ids, perf_event_fds, python_walker_pids, still_loaded  # noqa: F401 - still_loaded: the rows

# OPTRACE_UNDER_TEST: another optrace build to hold to the same rows (e.g. one from before issue 8's fixes).
OPTRACE = Path(os.environ.get("OPTRACE_UNDER_TEST") or Path(sys.executable).parent / "optrace")
PROGRAMS = Path(__file__).parent / "programs"
USER_NAME = "optrace-hostile"
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
JIT_BASE = 0x100000000000  # where programs/jitburn.c maps its code
RSS_LIMIT_KB = 1 << 20  # the bound: 1 GB peak RSS for every optrace process
DRAIN_S = 1.0  # record's and serve's drain period


@dataclass(frozen=True)
class HostileUser:
    """An unprivileged account (no groups) and the folder it owns."""

    name: str
    uid: int
    gid: int
    home: Path

    def argv(self, *argv: str | os.PathLike[str]) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--",
                *map(str, argv)]

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": USER_PATH, "HOME": str(self.home), "LANG": "C.UTF-8", **extra}

    def run(self, *argv: str | os.PathLike[str], timeout: float = 120, **extra_env: str) -> str:
        """Run a command as the user; its stdout (it must succeed)."""
        proc = subprocess.run(self.argv(*argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env(**extra_env), cwd=self.home)
        if proc.returncode != 0:
            raise AssertionError(f"as {self.name}: {' '.join(map(str, argv))} failed: {proc.stderr}")
        return proc.stdout

    def spawn(self, *argv: str | os.PathLike[str], **extra_env: str) -> subprocess.Popen:
        """Start a command as the user, niced (the machine has 2 CPUs shared with other test runs), in a
        session of its own so that the whole group can be killed."""
        return subprocess.Popen(self.argv("nice", "-n", "10", *argv), env=self.env(**extra_env), cwd=self.home,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)

    def write(self, path: Path, data: bytes, mode: int = 0o644) -> Path:
        """A file the user owns (written by root for speed, then given to the user: ownership is what
        optrace's rules look at)."""
        path.write_bytes(data)
        os.chown(path, self.uid, self.gid)
        os.chmod(path, mode)
        return path


@dataclass(frozen=True)
class Secret:
    """A root-only (0600) file in a root-owned folder the user can traverse, with a unique marker. The
    marker must never appear in anything optrace prints or writes."""

    marker: str
    folder: Path
    perf_map: Path  # <folder>/perf-1.map: a valid perf map naming JIT_BASE after the marker

    def assert_absent(self, *outputs: str | bytes, where: str = "output") -> None:
        for text in outputs:
            data = text.encode("utf-8", "replace") if isinstance(text, str) else text
            assert self.marker.encode() not in data, f"the root-only secret leaked into {where}"


def make_secret(base: Path) -> Secret:
    marker = f"OPTRACE_SECRET_{secrets.token_hex(8)}"
    folder = base / f"optrace-secret-{secrets.token_hex(4)}"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    secret = Secret(marker, folder, folder / "perf-1.map")
    # One valid line (its name is the marker) and two bad ones: a reader that goes through must not
    # print the name, nor say how many lines the file has.
    lines = f"{JIT_BASE:x} {1 << 24:x} {marker}\n{marker} bad line\nnot a perf map: {marker}\n"
    fd = os.open(secret.perf_map, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(lines)
    return secret


# -- measured runs of root's optrace -------------------------------------------------------------------
@dataclass
class Measured:
    """One finished optrace process."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_kb: int
    timed_out: bool
    attached_s: float | None = None  # seconds from start until its first BPF program was seen
    prog_ids: set[int] = field(default_factory=set)
    stop_s: float | None = None  # seconds from the stop signal to its exit
    # seconds until its last BPF program or perf event was seen: programs load one after another (the CFI
    # unwinder's step program takes the verifier seconds), `record -a` loads the busiest processes' unwind
    # tables before its sampler's events (SessionMode.unwind_busy_first), and a recording's time starts
    # after the last one
    loaded_s: float | None = None

    def describe(self) -> str:
        return (f"optrace {' '.join(self.argv[1:])}: exit {self.returncode}, {self.wall_s:.1f} s, "
                f"peak RSS {self.peak_rss_kb // 1024} MB{' (TIMED OUT, killed)' if self.timed_out else ''}\n"
                f"stderr: {self.stderr[-2000:]}")

    def assert_sane(self, max_wall_s: float) -> None:
        """Finished in time, under the RSS bound, without a traceback or an internal error."""
        assert not self.timed_out, self.describe()
        assert self.wall_s <= max_wall_s, f"took {self.wall_s:.1f} s > {max_wall_s} s: {self.describe()}"
        assert 0 < self.peak_rss_kb < RSS_LIMIT_KB, self.describe()
        assert "Traceback" not in self.stderr and "internal error" not in self.stderr, self.describe()
        assert self.returncode != 70, self.describe()


class Running:
    """An optrace process being measured, started under GNU time: its peak RSS must not include the
    test process's own (a child forked or vforked from pytest starts with pytest's memory counted, and
    the kernel keeps that high-water mark across exec), so optrace is forked by the small ``time``."""

    def __init__(self, args: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.argv = [str(OPTRACE), *args]
        tag = f"{time.monotonic_ns()}"
        self.out_path, self.err_path = workdir / f"{tag}.out", workdir / f"{tag}.err"
        self.rss_path = workdir / f"{tag}.rss"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", str(self.rss_path), *self.argv],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        self.started = time.monotonic()
        self.attached_s: float | None = None
        self.loaded_s: float | None = None
        self.prog_ids: set[int] = set()
        self.perf_events = 0  # the most perf event fds seen open at once
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        """optrace's own pid (time's child), once it has been forked."""
        if self._pid is None:
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except OSError:
                children = []
            self._pid = int(children[0]) if children else None
        return self._pid

    def signal(self, signum: int) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def poll_programs(self) -> None:
        found = bpf_prog_ids(self.pid) if self.pid else set()
        events = perf_event_fds(self.pid) if self.pid else 0
        if found and self.attached_s is None:
            self.attached_s = time.monotonic() - self.started
        if found - self.prog_ids or events > self.perf_events:
            self.loaded_s = time.monotonic() - self.started
        self.prog_ids |= found
        self.perf_events = max(self.perf_events, events)

    def wait_attached(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.attached_s is None and time.monotonic() < deadline and self.proc.poll() is None:
            self.poll_programs()
            time.sleep(0.05)
        assert self.attached_s is not None, f"{self.argv[1]} never attached: {self.stderr()[-2000:]}"

    def finish(self, timeout: float, stop_signal: int | None = None) -> Measured:
        """Wait (sending ``stop_signal`` first, if given) at most ``timeout`` s, then SIGKILL."""
        signalled = time.monotonic()
        if stop_signal is not None:
            self.signal(stop_signal)
        deadline = signalled + timeout
        timed_out = False
        while self.proc.poll() is None:
            if time.monotonic() > deadline and not timed_out:
                timed_out = True
                self.signal(signal.SIGKILL)
                deadline = time.monotonic() + 10
            elif time.monotonic() > deadline:
                self.proc.kill()
            self.poll_programs()
            time.sleep(0.05)
        wall = time.monotonic() - self.started
        usage = self.rss_path.read_text().split()
        code = self.proc.returncode
        return Measured(self.argv, code, self.out_path.read_text(errors="replace"), self.stderr(), wall,
                        int(usage[-1]) if usage and usage[-1].isdigit() else 0, timed_out, self.attached_s,
                        set(self.prog_ids), time.monotonic() - signalled if stop_signal is not None else None,
                        self.loaded_s)


def wait_walked(running: Running, pids: set[int], timeout: float = 120) -> None:
    """Until the recorder samples and its Python walker expands every one of ``pids``."""
    deadline, taken = time.monotonic() + timeout, set()
    while not (running.pid and perf_event_fds(running.pid) and pids <= (taken := python_walker_pids(running.pid))):
        assert running.proc.poll() is None, running.stderr()[-2000:]
        assert time.monotonic() < deadline, \
            f"the walker never took {sorted(pids - taken)} of {sorted(pids)}: {running.stderr()[-2000:]}"
        time.sleep(0.1)


def run_measured(args: list[str], workdir: Path, timeout: float = 60) -> Measured:
    return Running(args, workdir).finish(timeout)


def assert_one_line(stderr: str, what: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"{what}: expected a one-line message, got: {stderr[-3000:]!r}"
    assert "Traceback" not in stderr and "internal error" not in stderr, f"{what}: {stderr[-3000:]}"


# -- scraping ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scrape:
    status: int
    body: bytes
    seconds: float


def scrape(url: str, timeout: float = 30, auth: tuple[str, str] | None = None) -> Scrape:
    request = urllib.request.Request(url)
    if auth:
        import base64

        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Scrape(response.status, response.read(), time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return Scrape(exc.code, exc.read(), time.monotonic() - started)


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text(errors="replace"))
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {pattern!r}: {path.read_text()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} within {timeout} s: {path.read_text()[-2000:]}")


# -- record files ----------------------------------------------------------------------------------------
RECORD_HEADER = struct.Struct("<8sIIQQ")  # frontend/recordfile.py's layout, written independently here


def record_file_bytes(payload: bytes, level: int = 9) -> bytes:
    """A record file around any JSON payload (valid header, checksum, lengths)."""
    compressed = zlib.compress(payload, level)
    return RECORD_HEADER.pack(b"OPTRDATA", 1, zlib.crc32(compressed), len(compressed), len(payload)) + compressed


def record_payload(path: Path) -> bytes:
    data = path.read_bytes()
    return zlib.decompress(data[RECORD_HEADER.size:])


def remove_perf_maps(uid: int) -> None:
    """The /tmp/perf-PID.map files ``uid`` owns (others' come and go meanwhile: skipped)."""
    for path in Path("/tmp").glob("perf-*.map"):
        try:
            if path.lstat().st_uid == uid:
                path.unlink()
        except FileNotFoundError:
            continue


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a process started with start_new_session (and everything in its session's group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
