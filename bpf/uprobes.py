"""The BCC side of call counting: load uprobe_count.c once and attach it to uprobes by file offset.

Why not ``BPF.attach_uprobe``: in BCC 0.26 its ``addr`` is an ELF virtual address that BCC converts to a
file offset itself (``bcc_resolve_symname``), every probe attached from one program looks the same to
the program, and it attaches one perf event per probe, whose removal costs ~100 ms each here (an RCU
wait per uprobe): 500 probes took 50 s to detach, BCC's funccount likewise.

Here the program reads its probe id from the BPF cookie (``bpf_get_attach_cookie``), so one compiled
program counts any number of probes, and uprobes are attached straight from the offsets optrace resolved:
- kernel >= 6.6: one ``BPF_TRACE_UPROBE_MULTI`` link per batch (a register call, one binary), offsets and
  cookies as arrays: 500 probes attach in ~10 ms and detach in ~50 ms. A link cannot drop one offset,
  so a probe whose consumers all left stays in the kernel, ignored, until its link's last probe goes.
- older kernels: one perf event of the ``uprobe`` PMU per probe (``config1`` = path, ``config2`` =
  offset) linked with ``BPF_LINK_CREATE`` and the cookie; each detaches on its own.

Why the lingering probe is not swapped for a link without it: two links on one offset both fire for a
call while they overlap (counted twice), and closing the old one before the new one exists loses the
calls in between; telling, in the handler, which of the two links counts a given trap depends on the
order the kernel runs a uprobe's consumers in. A lingering probe costs a trap per call of a function
nobody counts (its hits go to an id nobody reads) and holds its id until its link closes; optrace's own
users (count, record, serve) register their probes once, so none lingers in practice.

Memory stays bounded however many processes come and go: the kernel keys per-process rows by an
instance (the process's first hit), and the exit tracepoint moves a finished process's instance to the
``exited`` map; :meth:`BpfUprobeAttacher.read` hands those rows out once (:class:`ExitedRow`) and deletes
them. The tracepoint was chosen over looking for pids in /proc: it is exact under pid reuse (pid_max is
32768 here) and in pid namespaces, and costs one hash lookup per process exit.

Nothing is created in tracefs: probes are file descriptors, closed by :meth:`BpfUprobeAttacher.detach`,
atexit, SIGTERM (made SystemExit so ``finally`` blocks run) or, whatever else happens, by the kernel
when the process dies.
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
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from optrace.bpf.abi import ProgType
from optrace.bpf.loader import load_bcc, load_function
from optrace.bpf.perfevents import PerfEventAttr
from optrace.errors import OptraceError
from optrace.fileaccess import printable
from optrace.probes import ExitedRow, KernelCounts, UnprobeableError, UprobeTarget
from optrace.kernel import TRACEFS_DIRS
from optrace.procfs import comm as process_comm

PROGRAM = Path(__file__).with_name("uprobe_count.c")
MAX_PROBES = 4096
MAX_ROWS = 65536

_SYSCALLS = {"x86_64": (298, 321), "aarch64": (241, 280)}  # (perf_event_open, bpf)
_UPROBE_PMU_TYPE = Path("/sys/bus/event_source/devices/uprobe/type")
_EXIT_FORMATS = tuple(Path(root, "events/sched/sched_process_exit/format") for root in TRACEFS_DIRS)
_PERF_FLAG_FD_CLOEXEC = 8
_BPF_LINK_CREATE = 28
_BPF_PERF_EVENT = 41
_BPF_TRACE_UPROBE_MULTI = 48
_BPF_ATTR_SIZE = 64
_ENOTSUPP = 524  # the kernel's answer for an instruction uprobes cannot handle (e.g. a lock prefix)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


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


def open_uprobe_event(path: str, offset: int, shown: str | None = None) -> int:
    """A perf event firing on every process's execution of ``path`` at file ``offset`` (``shown`` names it in errors)."""
    try:
        pmu_type = int(_UPROBE_PMU_TYPE.read_text())
    except OSError as exc:
        raise OptraceError(f"the kernel has no uprobe PMU ({_UPROBE_PMU_TYPE}): needs CONFIG_UPROBE_EVENTS") from exc
    path_buf = ctypes.create_string_buffer(os.fsencode(path))
    attr = PerfEventAttr(type=pmu_type, size=ctypes.sizeof(PerfEventAttr), sample_period=1, wakeup_events=1,
                         config1=ctypes.addressof(path_buf), config2=offset)
    fd = _libc.syscall(_syscall_numbers()[0], ctypes.byref(attr), -1, 0, -1, _PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        raise _os_error(f"cannot set a uprobe at offset {offset:#x} of {shown or path}")
    return fd


def _link_create(attr: ctypes.Array, what: str) -> int:
    fd = _libc.syscall(_syscall_numbers()[1], _BPF_LINK_CREATE, attr, _BPF_ATTR_SIZE)
    if fd < 0:
        raise _os_error(what)
    return fd


def link_program(prog_fd: int, perf_fd: int, cookie: int) -> int:
    """Attach a loaded kprobe-type program to a perf event, with ``cookie`` for bpf_get_attach_cookie."""
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    struct.pack_into("<IIIIQ", attr, 0, prog_fd, perf_fd, _BPF_PERF_EVENT, 0, cookie)
    return _link_create(attr, "cannot link the BPF program to a uprobe")


def link_uprobe_multi(prog_fd: int, path: str, offsets: list[int], cookies: list[int], shown: str | None = None) -> int:
    """One BPF link putting uprobes at every offset of ``path`` (all processes), cookie by cookie."""
    count = len(offsets)
    path_buf = ctypes.create_string_buffer(os.fsencode(path))
    offset_buf = (ctypes.c_uint64 * count)(*offsets)
    cookie_buf = (ctypes.c_uint64 * count)(*cookies)
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    struct.pack_into("<IIIIQQQQIII", attr, 0, prog_fd, 0, _BPF_TRACE_UPROBE_MULTI, 0,
                     ctypes.addressof(path_buf), ctypes.addressof(offset_buf), 0, ctypes.addressof(cookie_buf),
                     count, 0, 0)
    shown = shown or path
    what = f"cannot set a uprobe at offset {offsets[0]:#x} of {shown}" if count == 1 else \
        f"cannot set {count} uprobes in {shown}"
    return _link_create(attr, what)


@dataclass
class UprobeLink:
    """Uprobes held by file descriptors: closing them removes the uprobes from the kernel."""

    fds: tuple[int, ...]
    probe_ids: set[int]  # the cookies of its uprobes
    detached: set[int] = field(default_factory=set)  # ids no consumer uses any more

    @classmethod
    def perf(cls, prog_fd: int, path: str, offset: int, cookie: int, shown: str | None = None) -> UprobeLink:
        perf_fd = open_uprobe_event(path, offset, shown)
        try:
            return cls(fds=(link_program(prog_fd, perf_fd, cookie), perf_fd), probe_ids={cookie})
        except BaseException:
            os.close(perf_fd)
            raise

    @classmethod
    def multi(cls, prog_fd: int, path: str, offsets: list[int], cookies: list[int],
              shown: str | None = None) -> UprobeLink:
        return cls(fds=(link_uprobe_multi(prog_fd, path, offsets, cookies, shown),), probe_ids=set(cookies))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


@contextmanager
def pinned_files(targets: Sequence[UprobeTarget]) -> Iterator[dict[str, str]]:
    """Each target's path as ``/proc/self/fd/N`` of a descriptor of the very file its offset was checked
    on. The kernel resolves the path it is given when it attaches; a file swapped in between (a symlink
    to a system binary put in place of a user's own) would take a uprobe at an unchecked offset, in
    every process running it. The kernel follows the magic link to the pinned inode instead."""
    fds: dict[str, int] = {}
    try:
        for target in targets:
            if target.path not in fds:
                fds[target.path] = _pin(target)
        yield {path: f"/proc/self/fd/{fd}" for path, fd in fds.items()}
    finally:
        for fd in fds.values():
            os.close(fd)


def _pin(target: UprobeTarget) -> int:
    try:
        fd = os.open(target.path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise OptraceError(f"cannot set uprobes in {printable(target.path)}: {exc.strerror}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (target.dev, target.ino):
        os.close(fd)
        raise OptraceError(f"{printable(target.path)} was replaced after it was checked: nothing attached; run again")
    return fd


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

    def __init__(self, handler: str = "count_call", multi: bool | None = None) -> None:
        """``handler="empty_handler"`` attaches a program that counts nothing (for benchmarks);
        ``multi`` forces uprobe_multi links on or off (default: on where the kernel has them)."""
        cflags = [f"-DMAX_PROBES={MAX_PROBES}", f"-DMAX_ROWS={MAX_ROWS}"]
        if exit_has_group_dead():
            cflags.append("-DHAVE_GROUP_DEAD")
        self._bpf = load_bcc([PROGRAM], cflags)
        self._prog_fd, self.multi = self._load(handler, multi)
        self._links: dict[int, UprobeLink] = {}  # live probe id -> its link
        self._reserved: set[int] = set()  # ids held by open links, detached ones included
        self._stale: set[int] = set()  # freed ids whose kernel counts are not yet zeroed
        self._closed = False
        _install_exit_cleanup()
        _live.add(self)

    def _load(self, handler: str, multi: bool | None) -> tuple[int, bool]:
        if multi is not False:
            try:
                return self._bpf.load_func(handler.encode(), ProgType.KPROBE,
                                           attach_type=_BPF_TRACE_UPROBE_MULTI).fd, True
            except Exception:
                if multi:
                    raise OptraceError("this kernel has no uprobe_multi links (needs Linux 6.6)") from None
        return load_function(self._bpf, handler.encode(), ProgType.KPROBE).fd, False

    def attach(self, targets: Sequence[UprobeTarget]) -> list[int | UnprobeableError]:
        ids = self._allocate(len(targets))
        results: list[int | UnprobeableError] = list(ids)
        opened: list[UprobeLink] = []
        try:
            with pinned_files(targets) as pinned:
                if self.multi:
                    by_path: dict[str, list[int]] = {}
                    for index, target in enumerate(targets):
                        by_path.setdefault(target.path, []).append(index)
                    for path, indices in by_path.items():
                        self._link_batch(pinned[path], path, indices, targets, results, opened)
                else:
                    for index, target in enumerate(targets):
                        self._link_one(index, pinned[target.path], target, results, opened)
        except BaseException:
            for link in opened:
                link.close()
            self._reserved.difference_update(ids)
            raise
        for link in opened:
            self._links.update(dict.fromkeys(link.probe_ids, link))
        self._reserved.difference_update(r for r, i in zip(ids, results) if isinstance(i, UnprobeableError))
        return results

    def _link_batch(self, pinned: str, path: str, indices: list[int], targets: Sequence[UprobeTarget],
                    results: list, opened: list[UprobeLink]) -> None:
        """One link for the batch; if the kernel refuses an offset in it, halve until it is found."""
        cookies = [results[i] for i in indices]
        try:
            opened.append(UprobeLink.multi(self._prog_fd, pinned, [targets[i].offset for i in indices], cookies, path))
        except UnprobeableError as exc:
            if len(indices) == 1:
                results[indices[0]] = exc
                return
            half = len(indices) // 2
            self._link_batch(pinned, path, indices[:half], targets, results, opened)
            self._link_batch(pinned, path, indices[half:], targets, results, opened)

    def _link_one(self, index: int, pinned: str, target: UprobeTarget, results: list, opened: list[UprobeLink]) -> None:
        try:
            opened.append(UprobeLink.perf(self._prog_fd, pinned, target.offset, results[index], target.path))
        except UnprobeableError as exc:
            results[index] = exc

    def _allocate(self, count: int) -> list[int]:
        if self._stale:
            self._purge_stale()
        free = [i for i in range(MAX_PROBES) if i not in self._reserved][:count]
        if len(free) < count:
            raise OptraceError(f"too many probes: at most {MAX_PROBES} can be attached at once")
        self._reserved.update(free)
        return free

    def detach(self, probe_ids: Collection[int]) -> None:
        """Close the links whose probes are all detached; their counts are purged later in one pass."""
        for probe_id in probe_ids:
            link = self._links.pop(probe_id, None)
            if link is None:
                continue
            link.detached.add(probe_id)
            if link.detached == link.probe_ids:
                link.close()
                self._reserved.difference_update(link.probe_ids)
                self._stale.update(link.probe_ids)

    def follow(self, root_pid: int) -> None:
        followed = self._bpf[b"followed"]
        followed[followed.Key(root_pid)] = followed.Leaf(root_pid)

    def read(self) -> KernelCounts:
        """The counts now. Rows of processes that exited are handed out once, in
        :attr:`KernelCounts.exited`, and deleted from the kernel."""
        exited = {(_int(k.pid), k.instance): v.comm.decode(errors="replace")
                  for k, v in _all_items(self._bpf[b"exited"])}  # before the rows: theirs are final
        per_pid = self._bpf[b"per_pid"]
        totals, lost = self._bpf[b"totals"], self._bpf[b"lost_rows"]
        counts = KernelCounts(
            totals={probe_id: totals[totals.Key(probe_id)].value for probe_id in self._links},
            lost_rows={probe_id: lost[lost.Key(probe_id)].value for probe_id in self._links},
            followed={_int(k): _int(v) for k, v in _all_items(self._bpf[b"followed"])},
        )
        final = []
        for key, value in _all_items(per_pid):
            if (key.pid, key.instance) in exited:
                final.append((key, _int(value)))
            elif key.probe in self._links:
                row = (key.probe, key.pid)
                counts.per_pid[row] = counts.per_pid.get(row, 0) + _int(value)
        final.sort(key=lambda item: item[0].instance)
        counts.exited = [ExitedRow(probe_id=k.probe, pid=k.pid, calls=calls, comm=exited[(k.pid, k.instance)])
                         for k, calls in final if k.probe in self._links]
        _delete(per_pid, [key for key, _calls in final])
        _delete(self._bpf[b"exited"], [_instance_key(self._bpf[b"exited"], *ident) for ident in exited])
        self._add_comms(counts)
        return counts

    def _add_comms(self, counts: KernelCounts) -> None:
        procs = {_int(k): v.comm.decode(errors="replace") for k, v in _all_items(self._bpf[b"procs"])}
        for _probe, pid in counts.per_pid:
            if pid not in counts.comms:
                counts.comms[pid] = procs.get(pid) or process_comm(pid)

    def map_sizes(self) -> dict[str, int]:
        """Entries of the per-process maps, which the folding of exited processes keeps small."""
        return {name: len(_all_items(self._bpf[name.encode()])) for name in ("per_pid", "procs", "exited")}

    def close(self) -> None:
        """Detach every probe and free the BPF program and maps (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for link in {id(link): link for link in self._links.values()}.values():
            link.close()
        self._links.clear()
        self._bpf.cleanup()
        _live.discard(self)

    def _purge_stale(self) -> None:
        """Zero the counts of freed probe ids before they are handed out again."""
        per_pid = self._bpf[b"per_pid"]
        for probe_id in self._stale:
            for name in (b"totals", b"lost_rows"):
                table = self._bpf[name]
                table[table.Key(probe_id)] = table.Leaf(0)
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


def _delete(table, keys: list) -> None:
    for key in keys:
        try:
            del table[key]
        except KeyError:
            pass


def _instance_key(table, pid: int, instance: int):
    key = table.Key()
    key.pid, key.instance = pid, instance
    return key


def exit_has_group_dead() -> bool:
    """Whether sched_process_exit tells when a process's last thread exits (Linux 6.16+)."""
    for path in _EXIT_FORMATS:
        try:
            return "group_dead" in path.read_text()
        except OSError:
            continue
    return False


