"""The BCC side of call counting: load uprobe_count.c once and attach it to uprobes by file offset.

Why not ``BPF.attach_uprobe``: in BCC 0.26 its ``addr`` is an ELF virtual address that BCC converts to a
file offset itself (``bcc_resolve_symname``), and every probe attached from one program looks the same
to the program. Here each uprobe is a perf event of the kernel's ``uprobe`` PMU opened with the file
offset optrace resolved (``config1`` = path, ``config2`` = offset), and the program is linked to it with
``BPF_LINK_CREATE`` carrying the probe id as the BPF cookie (``bpf_get_attach_cookie``), so one compiled
program counts any number of probes, and adding one is two syscalls.

Nothing is created in tracefs: a probe is a pair of file descriptors, removed when they are closed, by
:meth:`BpfUprobeAttacher.detach`, atexit, SIGTERM (turned into SystemExit so ``finally`` blocks run) or,
whatever else happens, by the kernel when the process dies.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import platform
import signal
import struct
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from optrace.frontend.errors import OptraceError
from optrace.frontend.uprobes.manager import KernelCounts, UnprobeableError

PROGRAM = Path(__file__).with_name("uprobe_count.c")
MAX_PROBES = 4096
MAX_ROWS = 65536

_SYSCALLS = {"x86_64": (298, 321), "aarch64": (241, 280)}  # (perf_event_open, bpf)
_UPROBE_PMU_TYPE = Path("/sys/bus/event_source/devices/uprobe/type")
_PERF_FLAG_FD_CLOEXEC = 8
_BPF_LINK_CREATE = 28
_BPF_PERF_EVENT = 41
_BPF_ATTR_SIZE = 64
_ENOTSUPP = 524  # the kernel's answer for an instruction uprobes cannot handle (e.g. a lock prefix)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _PerfEventAttr(ctypes.Structure):
    """The head of ``struct perf_event_attr`` (PERF_ATTR_SIZE_VER5 = 112 bytes with the padding)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # uprobe_path
        ("config2", ctypes.c_uint64),  # probe_offset
        ("rest", ctypes.c_uint8 * 40),
    ]


def _syscall_numbers() -> tuple[int, int]:
    try:
        return _SYSCALLS[platform.machine()]
    except KeyError:
        raise OptraceError(f"uprobe counting is not supported on {platform.machine()}") from None


def _os_error(what: str) -> OptraceError:
    err = ctypes.get_errno()
    if err == _ENOTSUPP:
        return UnprobeableError(f"{what}: the kernel cannot single-step the instruction there")
    hint = ": run as root (or with CAP_BPF+CAP_PERFMON)" if err in (1, 13) else ""
    return OptraceError(f"{what}: {os.strerror(err)}{hint}")


def open_uprobe_event(path: str, offset: int) -> int:
    """A perf event firing on every process's execution of ``path`` at file ``offset``."""
    try:
        pmu_type = int(_UPROBE_PMU_TYPE.read_text())
    except OSError as exc:
        raise OptraceError(f"the kernel has no uprobe PMU ({_UPROBE_PMU_TYPE}): needs CONFIG_UPROBE_EVENTS") from exc
    path_buf = ctypes.create_string_buffer(os.fsencode(path))
    attr = _PerfEventAttr(type=pmu_type, size=ctypes.sizeof(_PerfEventAttr), sample_period=1, wakeup_events=1,
                          config1=ctypes.addressof(path_buf), config2=offset)
    fd = _libc.syscall(_syscall_numbers()[0], ctypes.byref(attr), -1, 0, -1, _PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        raise _os_error(f"cannot set a uprobe at offset {offset:#x} of {path}")
    return fd


def link_program(prog_fd: int, perf_fd: int, cookie: int) -> int:
    """Attach a loaded kprobe-type program to a perf event, with ``cookie`` for bpf_get_attach_cookie."""
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    struct.pack_into("<IIIIQ", attr, 0, prog_fd, perf_fd, _BPF_PERF_EVENT, 0, cookie)
    fd = _libc.syscall(_syscall_numbers()[1], _BPF_LINK_CREATE, attr, _BPF_ATTR_SIZE)
    if fd < 0:
        raise _os_error("cannot link the BPF program to a uprobe")
    return fd


@dataclass
class UprobeLink:
    """One attached uprobe: closing both descriptors removes it from the kernel."""

    perf_fd: int
    link_fd: int

    @classmethod
    def attach(cls, prog_fd: int, path: str, offset: int, cookie: int) -> UprobeLink:
        perf_fd = open_uprobe_event(path, offset)
        try:
            return cls(perf_fd=perf_fd, link_fd=link_program(prog_fd, perf_fd, cookie))
        except BaseException:
            os.close(perf_fd)
            raise

    def close(self) -> None:
        os.close(self.link_fd)
        os.close(self.perf_fd)


def load_bcc(**kwargs):
    """``bcc.BPF(**kwargs)``, with BCC's absence or a failed compile as an OptraceError."""
    try:
        import bcc
    except ImportError as exc:
        raise OptraceError("BCC is not importable (Debian package python3-bpfcc): run sudo make setup") from exc
    try:
        return bcc.BPF(**kwargs)
    except Exception as exc:
        raise OptraceError(f"cannot load the BPF program: {exc} (optrace doctor tells what is missing)") from exc


_live: weakref.WeakSet[BpfUprobeAttacher] = weakref.WeakSet()
_cleanup_installed = False


def _close_live() -> None:
    for attacher in list(_live):
        attacher.close()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _install_exit_cleanup() -> None:
    """atexit closes every attacher; a default SIGTERM becomes SystemExit so try/finally and atexit run."""
    global _cleanup_installed
    if _cleanup_installed:
        return
    _cleanup_installed = True
    atexit.register(_close_live)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


class BpfUprobeAttacher:
    """The :class:`optrace.frontend.uprobes.manager.Attacher` that counts in the kernel."""

    max_probes = MAX_PROBES

    def __init__(self, handler: str = "count_call") -> None:
        """``handler="empty_handler"`` attaches a program that counts nothing (for benchmarks)."""
        self._bpf = load_bcc(src_file=str(PROGRAM).encode(),
                             cflags=[f"-DMAX_PROBES={MAX_PROBES}", f"-DMAX_ROWS={MAX_ROWS}"])
        import bcc

        self._prog_fd = self._bpf.load_func(handler.encode(), bcc.BPF.KPROBE).fd
        self._links: dict[int, UprobeLink] = {}
        self._stale: set[int] = set()  # detached ids whose kernel counts are not yet zeroed
        self._closed = False
        _install_exit_cleanup()
        _live.add(self)

    def attach(self, probe_id: int, path: str, offset: int) -> None:
        if probe_id in self._stale:
            self._purge_stale()
        self._links[probe_id] = UprobeLink.attach(self._prog_fd, path, offset, probe_id)

    def detach(self, probe_id: int) -> None:
        """Close the probe; its kernel counts are purged later in one pass (detaching 500 stays fast)."""
        link = self._links.pop(probe_id, None)
        if link is not None:
            link.close()
            self._stale.add(probe_id)

    def follow(self, root_pid: int) -> None:
        followed = self._bpf[b"followed"]
        followed[followed.Key(root_pid)] = followed.Leaf(root_pid)

    def read(self) -> KernelCounts:
        totals = self._bpf[b"totals"]
        counts = KernelCounts(
            totals={probe_id: totals[totals.Key(probe_id)].value for probe_id in self._links},
            per_pid={(k.probe, k.pid): _int(v) for k, v in _all_items(self._bpf[b"per_pid"])
                     if k.probe in self._links},
            lost_rows=self._bpf[b"lost_rows"][0].value,
            followed={_int(k): _int(v) for k, v in _all_items(self._bpf[b"followed"])},
        )
        comms = {_int(k): v.comm.decode(errors="replace") for k, v in _all_items(self._bpf[b"comms"])}
        for _probe, pid in counts.per_pid:
            if pid not in counts.comms:
                counts.comms[pid] = comms.get(pid) or _proc_comm(pid)
        return counts

    def close(self) -> None:
        """Detach every probe and free the BPF program and maps (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for probe_id in list(self._links):
            self._links.pop(probe_id).close()
        self._bpf.cleanup()
        _live.discard(self)

    def _purge_stale(self) -> None:
        """Zero the counts of detached probe ids before an id is reused."""
        totals, per_pid = self._bpf[b"totals"], self._bpf[b"per_pid"]
        for probe_id in self._stale:
            totals[totals.Key(probe_id)] = totals.Leaf(0)
        for key in [k for k, _v in _all_items(per_pid) if k.probe in self._stale]:
            del per_pid[key]
        self._stale.clear()


def _int(value) -> int:
    """Batch lookups give plain ints for scalar keys and values, item lookups give ctypes."""
    return value if isinstance(value, int) else value.value


def _all_items(table) -> list:
    """Every (key, value) of a hash map, in batches of syscalls when the kernel allows it."""
    try:
        return list(table.items_lookup_batch())
    except Exception:  # BCC raises plain Exception when the kernel lacks BPF_MAP_LOOKUP_BATCH
        return table.items()


def _proc_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
