"""What the running kernel offers, read from /proc and tracefs: the facts that both ``optrace doctor`` and
the BPF programs in ``bpf/`` depend on. Nothing here imports BCC or loads a program."""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

COMM_MAX = 15  # bytes of a program's name the kernel keeps as its command name (TASK_COMM_LEN - 1)
CAP_SYS_ADMIN = 21
CAP_SYS_NICE = 23
CAP_PERFMON = 38
CAP_BPF = 39
SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_MAP_TYPE_ARRAY = 2
BPF_PROG_TYPE_KPROBE = 2
BPF_FUNC_PROBE_READ_USER = 112
BPF_FUNC_PROBE_READ_KERNEL = 113
TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
SYSCALL_EVENTS = ("sys_exit_mmap", "sys_exit_mprotect")  # how the sampler tells new executable mappings
VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
# Off-CPU time (bpf/offcpu.c): waits open on the software context-switch event (a perf event program, which
# can tail-call the stack walker) and close on the sched_switch raw tracepoint. Not tp_btf (BCC 0.26 cannot
# attach it), not a kprobe on finish_task_switch as BCC's offcputime (no kprobes here). 5.18: the kernel
# offcpu.c was first written for (prev_state in sched_switch); the event and the tracepoint are older.
OFF_CPU_HOOK = "context-switch event and raw tracepoint sched_switch"
OFF_CPU_MIN_KERNEL = (5, 18)
MAX_RATE_FILE = "/proc/sys/kernel/perf_event_max_sample_rate"
DEFAULT_MAX_RATE = 100000


def effective_capabilities() -> int:
    """CapEff from /proc/self/status (0 when it cannot be read)."""
    try:
        for line in Path("/proc/self/status").read_text(errors="replace").splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def bpf_map_create_errno() -> int:
    """Create and close a one-entry array map: 0 when bpf() is usable, else the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 32)(BPF_MAP_TYPE_ARRAY, 4, 4, 1)  # type, key size, value size, max entries
    fd = libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(BPF_MAP_CREATE), attr, ctypes.c_uint(ctypes.sizeof(attr)))
    if fd < 0:
        return ctypes.get_errno() or errno.EPERM
    os.close(fd)
    return 0


def bpf_helper_loads(helper: int) -> bool | None:
    """Whether the verifier accepts a kprobe program calling ``helper`` (a bpf_probe_read-like helper:
    destination on the stack, size, source): None when it refuses for another reason than the helper
    (no capability), so nothing is known."""
    libc = ctypes.CDLL(None, use_errno=True)
    program = _probe_read_call(helper)
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = (ctypes.c_uint64 * 16)()  # union bpf_attr's BPF_PROG_LOAD head, the rest zero
    attr[0] = BPF_PROG_TYPE_KPROBE | (len(program) // 8) << 32  # prog_type, insn_cnt
    attr[1] = ctypes.addressof(program)
    attr[2] = ctypes.addressof(license_)
    fd = libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(BPF_PROG_LOAD), attr, ctypes.c_uint(ctypes.sizeof(attr)))
    if fd >= 0:
        os.close(fd)
        return True
    return False if ctypes.get_errno() == errno.EINVAL else None


def read_kernel_file(path: str | Path, most: int) -> bytes | None:
    """At most ``most`` bytes of a file the kernel makes (/proc, /sys: not another user's, so read without
    the file rule); None when it cannot be read."""
    try:
        with open(path, "rb") as source:
            return source.read(most)
    except OSError:
        return None


def _probe_read_call(helper: int) -> ctypes.Array:
    """``helper(fp - 8, 8, 0); return 0;`` as BPF instructions (code, dst | src << 4, offset, immediate)."""
    insns = [(0xBF, 1 | 10 << 4, 0), (0x07, 1, -8), (0xB7, 2, 8), (0xB7, 3, 0), (0x85, 0, helper), (0xB7, 0, 0),
             (0x95, 0, 0)]
    packed = b"".join(struct.pack("<BBhi", code, regs, 0, imm) for code, regs, imm in insns)
    return ctypes.create_string_buffer(packed, len(packed))


def syscall_events_available() -> bool:
    """The mmap/mprotect exit tracepoints the sampler needs for raw user stacks, and the kernel's BTF its
    programs there need (bpf_get_current_task_btf, to read the call's arguments)."""
    return os.path.exists(VMLINUX_BTF) and any(
        all(os.path.exists(f"{root}/events/syscalls/{event}") for event in SYSCALL_EVENTS) for root in TRACEFS_DIRS)


def tracefs_mount_points() -> list[str]:
    """Where tracefs is mounted, among the places BCC looks (/proc/self/mounts is readable by anyone)."""
    try:
        lines = Path("/proc/self/mounts").read_text(errors="replace").splitlines()
    except OSError:
        return []
    points = [fields[1] for fields in (line.split() for line in lines) if len(fields) > 2 and fields[2] == "tracefs"]
    return [point for point in points if point in TRACEFS_DIRS]


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of the running kernel, (0, 0) when the release does not start with them."""
    parts = (release or os.uname().release).split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


def max_sample_rate() -> int:
    """kernel.perf_event_max_sample_rate: the highest -F the kernel accepts."""
    try:
        with open(MAX_RATE_FILE) as f:
            return int(f.read())
    except (OSError, ValueError):
        return DEFAULT_MAX_RATE
