"""Field offsets of kernel structures, from the running kernel's BTF (``/sys/kernel/btf/vmlinux``).

Why: the raw tracepoints (profile.c, uprobe_count.c, offcpu.c) are given task_struct and linux_binprm
pointers and read one field of each. BCC compiles against whatever kernel headers it finds, and on this
machine those are another kernel's (Debian's 6.1 headers for a 6.18 kernel, see NOTES), so ``offsetof`` from
the headers can be wrong; the kernel's own type information cannot. Perf tracepoints would spare the field
reads, but closing each one waits for RCU grace periods (32-70 ms on this VM, one after another), which
made a recording end 0.3 s after its target.

Only what the lookup needs is read: the string section is searched for the two names, then the type
section is walked up to the struct, recursing into anonymous members (task_struct and linux_binprm are
types 114 and 1,598 of this kernel's 126,689: 0.01 s, against 0.05 s for a walk of all 5.5 MB).
The file is the kernel's own (sysfs), not another user's, so it is read with a plain open, size-capped.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from optrace.errors import MalformedInput
from optrace.kernel import VMLINUX_BTF as VMLINUX

MAX_BTF = 64 << 20
MAGIC = 0xEB9F
HEADER = struct.Struct("<HBBIIIII")  # magic, version, flags, hdr_len, type_off, type_len, str_off, str_len
TYPE = struct.Struct("<III")  # name_off, info, size or type
MEMBER = struct.Struct("<III")  # name_off, type, offset (in bits; with kind_flag, the low 24 bits)
KIND_STRUCT, KIND_UNION = 4, 5
REFERENCE_KINDS = (8, 9, 10, 11)  # typedef, volatile, const, restrict: a type name for another type
MAX_TYPE_CHAIN = 16
# Bytes after the type record, by kind: per record, or per vlen item.
FIXED_TAIL = {1: 4, 3: 12, 14: 4, 17: 4}
ITEM_TAIL = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}


class BtfError(MalformedInput):
    """The kernel's BTF is not what its header says (or not this byte order)."""


@dataclass(frozen=True)
class KernelOffsets:
    """What the raw tracepoints read (byte offsets)."""

    task_tgid: int
    binprm_filename: int
    task_fsbase: int = 0  # task_struct.thread.fsbase (python.c); 0: unknown, Python threads are not found
    task_state: int = 0  # task_struct.__state (offcpu.c); 0: unknown, the headers' offset is used
    # task_struct.se.sum_exec_runtime and .start_time (profile.c: the CPU time of a thread that ends between
    # two ticks); 0: unknown, the headers' offsets are used
    task_runtime: int = 0
    task_start_time: int = 0

    def values(self) -> tuple[int, ...]:
        """In enum kernel_offset's order (kernel_offsets.h)."""
        return (self.task_tgid, self.binprm_filename, self.task_fsbase, self.task_state, self.task_runtime,
                self.task_start_time)


@functools.cache
def vmlinux_types(path: str = VMLINUX) -> BtfTypes | None:
    """The running kernel's BTF types, None when it has none (or a malformed one)."""
    try:
        with open(path, "rb") as btf:
            data = btf.read(MAX_BTF + 1)
    except OSError:
        return None
    if len(data) > MAX_BTF:
        return None
    try:
        return BtfTypes(data)
    except (BtfError, struct.error):
        return None


@functools.cache
def kernel_offsets(path: str = VMLINUX) -> KernelOffsets | None:
    """The running kernel's offsets; None when it has no BTF or the BTF lacks one of them."""
    types = vmlinux_types(path)
    if types is None:
        return None
    try:
        tgid = types.member_offset("task_struct", "tgid")
        filename = types.member_offset("linux_binprm", "filename")
        thread = types.member_offset("task_struct", "thread")
        fsbase = types.member_offset("thread_struct", "fsbase")
        state = types.member_offset("task_struct", "__state")
        entity = types.member_offset("task_struct", "se")
        runtime = types.member_offset("sched_entity", "sum_exec_runtime")
        start_time = types.member_offset("task_struct", "start_time")
    except (BtfError, struct.error):
        return None
    if tgid is None or filename is None:
        return None
    return KernelOffsets(tgid, filename, thread + fsbase if thread is not None and fsbase is not None else 0,
                         state or 0, entity + runtime if entity is not None and runtime is not None else 0,
                         start_time or 0)


class BtfTypes:
    """A BTF blob's types, indexed by id (1-based, as in BTF) on first use."""

    def __init__(self, data: bytes) -> None:
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise BtfError("not BTF (or not this byte order)")
        self.types = memoryview(data)[hdr_len + type_off:hdr_len + type_off + type_len]
        self.strings = bytes(data[hdr_len + str_off:hdr_len + str_off + str_len])
        self._starts: list[int] = []  # where each type starts, as far as the walk has gone
        self._walked = 0  # where the next type starts
        self._struct_ids: dict[str, int | None] = {}

    def name_offset(self, name: str) -> int | None:
        """Where ``name`` starts in the string section (names are stored once, NUL-terminated)."""
        at = self.strings.find(b"\0" + name.encode() + b"\0")
        return None if at < 0 else at + 1

    def member_offset(self, struct_name: str, member: str) -> int | None:
        """Byte offset of ``member`` in the struct named ``struct_name`` (anonymous members searched too)."""
        type_id, member_off = self._struct_id(struct_name), self.name_offset(member)
        if type_id is None or member_off is None:
            return None
        bits = self._find(type_id, member_off, set())
        return None if bits is None else bits // 8

    def member_struct_name(self, struct_name: str, member: str) -> str | None:
        """The name of the struct a member of ``struct_name`` is (through typedefs and qualifiers), None when
        it is not a named struct."""
        struct_id, member_off = self._struct_id(struct_name), self.name_offset(member)
        if struct_id is None or member_off is None:
            return None
        start = self._start(struct_id)
        _, info, _ = TYPE.unpack_from(self.types, start)
        for i in range(info & 0xFFFF):
            name_off, member_type, _ = MEMBER.unpack_from(self.types, start + TYPE.size + i * MEMBER.size)
            if name_off == member_off:
                return self._struct_name(member_type)
        return None

    def _struct_id(self, struct_name: str) -> int | None:
        """The id of the (non-empty) struct named ``struct_name``, each looked up once."""
        if struct_name not in self._struct_ids:
            self._struct_ids[struct_name] = self._first_struct(struct_name)
        return self._struct_ids[struct_name]

    def _first_struct(self, struct_name: str) -> int | None:
        struct_off = self.name_offset(struct_name)
        type_id = 1
        while struct_off is not None and (start := self._start(type_id)) is not None:
            name_off, info, _ = TYPE.unpack_from(self.types, start)
            if name_off == struct_off and (info >> 24) & 0x1F == KIND_STRUCT and info & 0xFFFF:
                return type_id
            type_id += 1
        return None

    def _struct_name(self, type_id: int) -> str | None:
        for _ in range(MAX_TYPE_CHAIN):  # typedefs and qualifiers, a bounded chain (a corrupt blob may loop)
            start = self._start(type_id)
            if start is None:
                return None
            name_off, info, next_id = TYPE.unpack_from(self.types, start)
            kind = (info >> 24) & 0x1F
            if kind == KIND_STRUCT:
                end = self.strings.find(b"\0", name_off)
                return self.strings[name_off:end].decode() if name_off and end > name_off else None
            if kind not in REFERENCE_KINDS:
                return None
            type_id = next_id
        return None

    def _find(self, type_id: int, member_off: int, seen: set[int]) -> int | None:
        """Bit offset of the member named at ``member_off`` in struct/union ``type_id``, looking into its
        anonymous members (each type once: a corrupt blob cannot make this loop)."""
        start = self._start(type_id)
        if start is None or type_id in seen:
            return None
        seen.add(type_id)
        _, info, _ = TYPE.unpack_from(self.types, start)
        if (info >> 24) & 0x1F not in (KIND_STRUCT, KIND_UNION):
            return None
        kind_flag = info >> 31
        for i in range(info & 0xFFFF):
            name_off, member_type, offset = MEMBER.unpack_from(self.types, start + TYPE.size + i * MEMBER.size)
            bits = offset & 0xFFFFFF if kind_flag else offset
            if name_off == member_off:
                return bits
            if name_off == 0:
                inner = self._find(member_type, member_off, seen)  # the anonymous struct or union
                if inner is not None:
                    return bits + inner
        return None

    def _start(self, type_id: int) -> int | None:
        """Where type ``type_id`` (1-based) starts; the types are walked only as far as asked (the structs
        looked up come early: task_struct is type 114 of 126,689 here)."""
        starts, types = self._starts, self.types
        while len(starts) < type_id and self._walked < len(types):
            starts.append(self._walked)
            _, info, _ = TYPE.unpack_from(types, self._walked)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            self._walked += TYPE.size + FIXED_TAIL.get(kind, 0) + ITEM_TAIL.get(kind, 0) * vlen
        return starts[type_id - 1] if 0 < type_id <= len(starts) else None
