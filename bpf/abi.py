"""The kernel's numbers the BPF side names (program, map and perf event types, instruction fields) and the
CPU lists, as BCC's Python names them, without importing BCC: importing it loads libbcc.so, which maps
clang and LLVM (19 ms and 62 MB of RSS here) whether or not anything is compiled."""
from __future__ import annotations

import functools
from pathlib import Path


class ProgType:
    """enum bpf_prog_type (BCC: ``BPF.KPROBE``, ``BPF.PERF_EVENT``...)."""

    SOCKET_FILTER = 1
    KPROBE = 2
    TRACEPOINT = 5
    PERF_EVENT = 7
    RAW_TRACEPOINT = 17


class MapType:
    """enum bpf_map_type, those whose tables bpf/tables.py gives an interface of their own."""

    HASH = 1
    ARRAY = 2
    PROG_ARRAY = 3
    PERF_EVENT_ARRAY = 4
    PERCPU_HASH = 5
    PERCPU_ARRAY = 6
    STACK_TRACE = 7
    LRU_HASH = 9
    LRU_PERCPU_HASH = 10
    RINGBUF = 27


class PerfType:
    """enum perf_type_id."""

    HARDWARE = 0
    SOFTWARE = 1
    TRACEPOINT = 2


class PerfHWConfig:
    CPU_CYCLES = 0


class PerfSWConfig:
    CPU_CLOCK = 0
    CONTEXT_SWITCHES = 3  # offcpu.c's switch-outs


# A BPF instruction: code, dst_reg | src_reg << 4, offset, immediate (struct bpf_insn).
INSN_SIZE = 8
LD_IMM64 = 0x18  # BPF_LD | BPF_DW | BPF_IMM: two instructions, the second's immediate the high half
PSEUDO_MAP_FD = 1  # ld_imm64's src_reg: the immediate is a map's fd (BCC writes its maps' fds there)
PSEUDO_MAP_VALUE = 2  # ... a map's fd, the second immediate an offset into its value

ONLINE_CPUS = Path("/sys/devices/system/cpu/online")
POSSIBLE_CPUS = Path("/sys/devices/system/cpu/possible")


def cpu_list(text: str) -> list[int]:
    """A kernel CPU list ("0-3,5") as numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def online_cpus() -> list[int]:
    return cpu_list(ONLINE_CPUS.read_text())


@functools.cache
def possible_cpus() -> list[int]:
    """Fixed while the machine runs: a per-CPU map's value holds one slot per possible CPU."""
    return cpu_list(POSSIBLE_CPUS.read_text())
