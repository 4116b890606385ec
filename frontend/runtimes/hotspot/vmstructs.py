"""The VM's description of itself, read from a live HotSpot's memory: ``gHotSpotVMStructs`` (type, field,
offset or static address), ``gHotSpotVMTypes`` (type, size), ``gHotSpotVMIntConstants`` and
``gHotSpotVMLongConstants`` (name, value), each an array whose entry layout the VM also exports
(jvmfile.py). This is what the Serviceability Agent and DTrace's libjvm_db read.

The tables are the process's memory, which its owner controls: at most MAX_ENTRIES entries per table, an
entry at most MAX_STRIDE bytes, a name at most MAX_NAME bytes (a longer one is dropped), reads batched
(MAX_BATCH entries or names per system call); the table ends at the first entry without a type name.
Static addresses are kept without the load bias, so one reading serves every process of the same libjvm.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Protocol, Sequence

STR, U32, U64 = "str", "u32", "u64"
# Each table: the symbol of its pointer, of its entries' stride, then (symbol of a field's offset, its kind)
TABLES: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "structs": ("gHotSpotVMStructs", "gHotSpotVMStructEntryArrayStride", (
        ("gHotSpotVMStructEntryTypeNameOffset", STR), ("gHotSpotVMStructEntryFieldNameOffset", STR),
        ("gHotSpotVMStructEntryTypeStringOffset", STR), ("gHotSpotVMStructEntryIsStaticOffset", U32),
        ("gHotSpotVMStructEntryOffsetOffset", U64), ("gHotSpotVMStructEntryAddressOffset", U64))),
    "types": ("gHotSpotVMTypes", "gHotSpotVMTypeEntryArrayStride", (
        ("gHotSpotVMTypeEntryTypeNameOffset", STR), ("gHotSpotVMTypeEntrySuperclassNameOffset", STR),
        ("gHotSpotVMTypeEntryIsOopTypeOffset", U32), ("gHotSpotVMTypeEntryIsIntegerTypeOffset", U32),
        ("gHotSpotVMTypeEntryIsUnsignedOffset", U32), ("gHotSpotVMTypeEntrySizeOffset", U64))),
    "ints": ("gHotSpotVMIntConstants", "gHotSpotVMIntConstantEntryArrayStride", (
        ("gHotSpotVMIntConstantEntryNameOffset", STR), ("gHotSpotVMIntConstantEntryValueOffset", U32))),
    "longs": ("gHotSpotVMLongConstants", "gHotSpotVMLongConstantEntryArrayStride", (
        ("gHotSpotVMLongConstantEntryNameOffset", STR), ("gHotSpotVMLongConstantEntryValueOffset", U64))),
}
SYMBOLS = tuple(name for table, stride, fields in TABLES.values() for name in (table, stride, *(f for f, _ in fields)))
WIDTHS = {STR: 8, U32: 4, U64: 8}
MAX_ENTRIES = 16384  # real tables: ~3,000 struct entries, ~1,000 types, ~1,500 constants
MAX_STRIDE = 256
MAX_NAME = 128
MAX_BATCH = 256  # ranges of one read (frontend/runtimes/cpython/memory.py's MAX_RANGES)
_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")


class Memory(Protocol):
    """A process's memory read with bounds (frontend/runtimes/cpython/memory.py's ProcessMemory, or a snapshot's)."""

    def read(self, address: int, size: int) -> bytes: ...
    def read_exact(self, address: int, size: int) -> bytes | None: ...
    def pointer(self, address: int) -> int | None: ...
    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...


@dataclass(frozen=True)
class VMStructs:
    """What one libjvm's tables say ("Type::_field" keys; static addresses before the load bias)."""

    offsets: dict[str, int] = field(default_factory=dict)  # non-static fields
    types: dict[str, str] = field(default_factory=dict)  # every field's C type as the table spells it
    addresses: dict[str, int] = field(default_factory=dict)  # static fields
    sizes: dict[str, int] = field(default_factory=dict)  # sizeof(type)
    ints: dict[str, int] = field(default_factory=dict)
    longs: dict[str, int] = field(default_factory=dict)


def read_vmstructs(memory: Memory, symbols: dict[str, int], bias: int) -> VMStructs | str:
    """The tables of the VM whose libjvm has ``symbols`` (link-time addresses) at load ``bias``, or why not."""
    tables = {}
    for name, (table, stride, fields) in TABLES.items():
        found = _read_table(memory, [symbols[s] + bias for s in (table, stride, *(f for f, _ in fields))],
                            [kind for _, kind in fields])
        if isinstance(found, str):
            return f"{table}: {found}"
        tables[name] = found
    out = VMStructs()
    for type_name, field_name, type_string, is_static, offset, address in tables["structs"]:
        key = f"{type_name}::{field_name}"
        out.types[key] = type_string or ""
        if is_static:
            out.addresses[key] = (address - bias) & ((1 << 64) - 1)
        else:
            out.offsets[key] = offset
    for type_name, _super, _oop, _integer, _unsigned, size in tables["types"]:
        out.sizes[type_name] = size
    out.ints.update((name, _signed32(value)) for name, value in tables["ints"])
    out.longs.update(tables["longs"])
    return out


def _signed32(value: int) -> int:
    return _I32.unpack(struct.pack("<I", value & 0xFFFFFFFF))[0]


def _read_table(memory: Memory, addresses: list[int], kinds: list[str]) -> list[tuple] | str:
    """The entries of one table: for each, its fields in TABLES's order (strings for the name fields,
    integers for the others); ``addresses``: the table pointer's, then the stride's and the fields' offsets'."""
    header = memory.read_ranges([(address, 8) for address in addresses])
    if any(len(word) != 8 for word in header):
        return "unreadable"
    base, stride, *offsets = (_U64.unpack(word)[0] for word in header)
    if not base or not 0 < stride <= MAX_STRIDE or any(o + WIDTHS[k] > stride for o, k in zip(offsets, kinds)):
        return f"bad table layout (stride {stride})"
    names = {i for i, kind in enumerate(kinds) if kind == STR}
    entries: list[tuple] = []
    strings: dict[int, str | None] = {}
    for start in range(0, MAX_ENTRIES, MAX_BATCH):
        chunk = memory.read_ranges([(base + (start + i) * stride, stride) for i in range(MAX_BATCH)])
        raw = []
        for data in chunk:
            if len(data) != stride:
                return "entry unreadable"
            values = [_field(data, offset, kind) for offset, kind in zip(offsets, kinds)]
            if not values[0]:  # no type name: the table's end
                return _named(memory, entries + raw, names, strings)
            raw.append(values)
        entries += raw
    return "no end within MAX_ENTRIES entries"


def _field(data: bytes, offset: int, kind: str) -> int:
    return struct.unpack_from("<I" if kind == U32 else "<Q", data, offset)[0]


def _named(memory: Memory, entries: list[list[int]], names: set[int], strings: dict[int, str | None]) -> list[tuple]:
    """The entries with their name pointers read as strings (each distinct pointer once); an entry whose
    type name cannot be read is dropped."""
    wanted = sorted({entry[i] for entry in entries for i in names if entry[i] and entry[i] not in strings})
    for start in range(0, len(wanted), MAX_BATCH):
        batch = wanted[start:start + MAX_BATCH]
        for pointer, data in zip(batch, memory.read_ranges([(p, MAX_NAME) for p in batch])):
            strings[pointer] = _cstring(data)
    out = []
    for entry in entries:
        values = [strings.get(v) if i in names else v for i, v in enumerate(entry)]
        if values[0] is not None:
            out.append(tuple(values))
    return out


def _cstring(data: bytes) -> str | None:
    """The NUL-terminated ASCII name at the start of ``data`` (None: none within MAX_NAME bytes, or not text)."""
    end = data.find(b"\0")
    if end < 0:
        return None
    try:
        return data[:end].decode("ascii")
    except UnicodeDecodeError:
        return None
