"""What a recording profiles: a command started for it, running processes, or the whole machine."""
from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable

from optrace.errors import OptraceError
from optrace.procfs import descendants


def parse_pids(values: tuple[str, ...] | list[str]) -> list[int]:
    """`-p 1 -p 2` and perf's `-p 1,2` both work, in every command and in serve's config file."""
    pids = []
    for value in values:
        for part in str(value).split(","):
            if not part.strip().isdigit() or int(part) <= 0:
                raise OptraceError(f"not a process id: {part.strip()!r}")
            pids.append(int(part))
    return pids


def check_pids(pids: list[int] | tuple[int, ...]) -> None:
    """Every command says the same thing about a pid that does not exist."""
    for pid in pids:
        if pid <= 0 or not os.path.exists(f"/proc/{pid}"):
            raise OptraceError(f"no such process: {pid}")


LISTINGS = 8  # descendants listed again after the attach until none is new (as perfevents.py's threads)


def with_subprocesses(pids: list[int], subprocesses: bool) -> list[int]:
    """--subprocesses (py-spy's): the pids and the processes descending from them now, parents first; given
    to the session, so their mappings are read and their tables built before the sampler attaches."""
    return pids + sorted(descendants(pids)) if subprocesses else pids


def add_subprocesses(targets: Callable[[], set[int]], add_pid: Callable[[int], None]) -> None:
    """After the attach, with --subprocesses: the targets' descendants that are not targets yet (forked
    after :func:`with_subprocesses` listed them, before their parent's events were opened: they inherited
    none) become targets, listed again until none is new. Those forked later inherit the events."""
    for _ in range(LISTINGS):
        known = targets()
        new = descendants(known) - known
        if not new:
            return
        for pid in sorted(new):
            add_pid(pid)


def shell_status(status: int) -> int:
    """A child's exit status as a shell gives it: its code, or 128+N when signal N ended it."""
    return status if status >= 0 else 128 - status


def check_command(argv: list[str]) -> None:
    """Fail before loading BPF when the command cannot be run (like a shell: exit 127)."""
    name = argv[0]
    path = name if "/" in name else shutil.which(name)
    if path is None or not os.path.exists(path):
        raise OptraceError(f"command not found: {name}", exit_code=127)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise OptraceError(f"cannot execute {name}: permission denied or not a program", exit_code=126)


LAUNCHER_COMM = "optrace-exec"  # the forked command before its exec: optrace's own overhead


class GatedChild:
    """A command forked but held before exec until the profiler knows its pid, so no early sample is
    missed (perf record does the same with its workload pipe). subprocess cannot do this: Popen waits
    for the exec to happen."""

    def __init__(self, argv: list[str]) -> None:
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            self._child(argv, read_fd, write_fd)
        os.close(read_fd)
        self._gate_fd = write_fd
        self.returncode: int | None = None

    @staticmethod
    def _child(argv: list[str], read_fd: int, write_fd: int) -> None:
        try:
            os.close(write_fd)
            with open("/proc/self/comm", "w") as comm:
                comm.write(LAUNCHER_COMM)  # like perf's "perf-exec": its samples are optrace's, left out
            os.read(read_fd, 1)
            os.close(read_fd)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"optrace: cannot run {argv[0]}: {exc.strerror}\n".encode())
        finally:
            os._exit(127)

    def release(self) -> None:
        if self._gate_fd >= 0:
            os.write(self._gate_fd, b"x")
            os.close(self._gate_fd)
            self._gate_fd = -1

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.returncode

    def stop(self, timeout: float = 2.0) -> int:
        """End the command when the recording ends first (duration or a signal to optrace)."""
        self.release()
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            if self.wait(timeout) is None:
                os.kill(self.pid, signal.SIGKILL)
                self.wait(timeout)
        return self.returncode if self.returncode is not None else -signal.SIGKILL


class ExitWatch:
    """Wakes a wait as soon as a watched process exits (a pidfd becomes readable), not at the next poll:
    a recording that ends with its target is written that much sooner."""

    def __init__(self, pids: list[int]) -> None:
        self.fds: list[int] = []
        self.blind = False  # a process it could not watch (no pidfd here): the caller must poll for its end
        for pid in pids:
            try:
                self.fds.append(os.pidfd_open(pid))
            except ProcessLookupError:  # already gone: the caller's own check sees it
                pass
            except OSError:
                self.blind = True

    def ended(self, fds: Iterable[int]) -> None:
        """These of :attr:`fds` were readable: their processes have exited, and are not watched from now on."""
        for fd in fds:
            if fd in self.fds:
                self.fds.remove(fd)
                os.close(fd)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def describe_exit(status: int | None) -> str:
    if status is None:
        return "still running"
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"
