"""What BCC's compile of a program produced, as data: its maps (type, sizes, flags, the descriptions of
their key and value types and of a perf output's events), and each function's instructions with the
places where a map's fd goes. bpf/programobject.py makes a running program of it; bpf/programcache.py
stores it.

Encoded as JSON and the instructions, in one payload. Decoding trusts nothing of what it is given
(the cache's checksum says only that the entry is the one written, not that a program written by
another optrace is sound): every field is checked for type and range, every relocation must name a map
and point at a ``ld_imm64`` carrying a map reference, and anything else is a :class:`CompiledError`.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from optrace.bpf.abi import INSN_SIZE, LD_IMM64, PSEUDO_MAP_FD, PSEUDO_MAP_VALUE
from optrace.errors import MalformedInput

INSN = struct.Struct("<BBhi")
LENGTH = struct.Struct("<I")
MAX_DESCRIPTION = 4 << 20
MAX_TABLES = 256
MAX_FUNCTIONS = 256
MAX_INSNS = 1_000_000  # the kernel's own limit per program
MAX_ENTRIES = 1 << 32
MAX_NAME = 256
MAX_FIELDS = 256
MAX_DESC = 1 << 16  # characters of one type description's JSON


class CompiledError(MalformedInput):
    pass


@dataclass(frozen=True)
class TableSpec:
    """One map, as BCC declared it."""

    name: bytes
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    key_desc: str  # BCC's JSON description of the key type (typedesc.decode_type)
    leaf_desc: str
    event_fields: tuple[str, ...] = ()  # a perf or ring buffer output's event: "name#type" per field


@dataclass(frozen=True)
class FunctionSpec:
    """One function's instructions; ``relocations``: (instruction index, table index) of every ld_imm64
    that loads a map reference, whose immediate is that map's fd in the running program."""

    name: bytes
    insns: bytes
    relocations: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CompiledProgram:
    license: bytes
    kern_version: int
    tables: tuple[TableSpec, ...]
    functions: tuple[FunctionSpec, ...]
    kernel_offsets: tuple[int, ...] | None = None  # bpf/btf.py's offsets at the compile, None: the headers'

    def table_index(self, name: bytes) -> int | None:
        for index, table in enumerate(self.tables):
            if table.name == name:
                return index
        return None

    def function(self, name: bytes) -> FunctionSpec | None:
        for function in self.functions:
            if function.name == name:
                return function
        return None


def relocations(insns: bytes, table_of_fd: dict[int, int]) -> tuple[tuple[int, int], ...]:
    """Where a compiled function loads a map's fd (``table_of_fd``: fd -> table index): BCC writes its own
    maps' fds into the instructions. An fd of no table, or another kind of reference, is an error: the
    program could not be loaded with other maps."""
    found = []
    for index in range(len(insns) // INSN_SIZE):
        code, regs, _, imm = INSN.unpack_from(insns, index * INSN_SIZE)
        if code != LD_IMM64:
            continue
        source = regs >> 4
        if source in (PSEUDO_MAP_FD, PSEUDO_MAP_VALUE):
            if imm not in table_of_fd:
                raise CompiledError(f"instruction {index} loads fd {imm}, not a map of the program")
            found.append((index, table_of_fd[imm]))
        elif source:
            raise CompiledError(f"instruction {index} holds a reference (kind {source}) a stored program cannot keep")
    return tuple(found)


def relocated(function: FunctionSpec, map_fds: list[int]) -> bytes:
    """The function's instructions with each map reference set to that map's fd in this process."""
    insns = bytearray(function.insns)
    for index, table in function.relocations:
        code, regs, offset, _ = INSN.unpack_from(insns, index * INSN_SIZE)
        INSN.pack_into(insns, index * INSN_SIZE, code, regs, offset, map_fds[table])
    return bytes(insns)


def encode(program: CompiledProgram) -> bytes:
    """The description's JSON (its length first, u32) and the instructions back to back, each function's
    place in the description: one payload, all of it under the cache entry's checksum."""
    functions, offset = [], 0
    for function in program.functions:
        functions.append({"name": function.name.decode(), "offset": offset, "size": len(function.insns),
                          "relocations": [list(pair) for pair in function.relocations]})
        offset += len(function.insns)
    description = {
        "license": program.license.decode(),
        "kern_version": program.kern_version,
        "kernel_offsets": list(program.kernel_offsets) if program.kernel_offsets is not None else None,
        "tables": [{"name": t.name.decode(), "type": t.map_type, "key_size": t.key_size, "value_size": t.value_size,
                    "max_entries": t.max_entries, "flags": t.flags, "key_desc": t.key_desc, "leaf_desc": t.leaf_desc,
                    "event_fields": list(t.event_fields)} for t in program.tables],
        "functions": functions,
    }
    text = json.dumps(description).encode()
    return LENGTH.pack(len(text)) + text + b"".join(function.insns for function in program.functions)


def decode(payload: bytes) -> CompiledProgram:
    """The program of an entry's payload, checked (see the module docstring)."""
    if len(payload) < LENGTH.size:
        raise CompiledError("not a stored program: too short")
    (length,) = LENGTH.unpack_from(payload)
    if length > MAX_DESCRIPTION or LENGTH.size + length > len(payload):
        raise CompiledError("not a stored program: its description is longer than the entry")
    try:
        description = json.loads(payload[LENGTH.size:LENGTH.size + length])
    except (ValueError, RecursionError):
        raise CompiledError("not a stored program: its description is not JSON") from None
    insns = payload[LENGTH.size + length:]
    try:
        tables = tuple(_table(item) for item in _list(description["tables"], MAX_TABLES))
        functions = tuple(_function(item, insns, len(tables)) for item in _list(description["functions"], MAX_FUNCTIONS))
        offsets = description["kernel_offsets"]
        if offsets is not None:
            offsets = tuple(_int(value, 0, 1 << 16) for value in _list(offsets, 8))
        return CompiledProgram(license=_name(description["license"]),
                               kern_version=_int(description["kern_version"], 0, 1 << 32),
                               tables=tables, functions=functions, kernel_offsets=offsets)
    except (KeyError, TypeError, AttributeError) as exc:
        raise CompiledError(f"not a stored program: {exc!r}") from None


def _table(item: dict) -> TableSpec:
    desc = [_json_text(item[key]) for key in ("key_desc", "leaf_desc")]
    return TableSpec(name=_name(item["name"]), map_type=_int(item["type"], 1, 1 << 16),
                     key_size=_int(item["key_size"], 0, 1 << 16), value_size=_int(item["value_size"], 0, 1 << 30),
                     max_entries=_int(item["max_entries"], 0, MAX_ENTRIES), flags=_int(item["flags"], 0, 1 << 32),
                     key_desc=desc[0], leaf_desc=desc[1],
                     event_fields=tuple(_text(value) for value in _list(item["event_fields"], MAX_FIELDS)))


def _function(item: dict, payload: bytes, tables: int) -> FunctionSpec:
    offset, size = _int(item["offset"], 0, len(payload)), _int(item["size"], INSN_SIZE, MAX_INSNS * INSN_SIZE)
    if size % INSN_SIZE or offset % INSN_SIZE or offset + size > len(payload):
        raise CompiledError("a function's instructions are not within the entry")
    insns = payload[offset:offset + size]
    pairs = []
    for pair in _list(item["relocations"], size // INSN_SIZE):
        index, table = (_int(value, 0, 1 << 32) for value in _list(pair, 2))
        if index >= size // INSN_SIZE - 1 or table >= tables:
            raise CompiledError("a relocation is outside the function or names no map")
        code, regs, _, _ = INSN.unpack_from(insns, index * INSN_SIZE)
        if code != LD_IMM64 or regs >> 4 not in (PSEUDO_MAP_FD, PSEUDO_MAP_VALUE):
            raise CompiledError("a relocation points at no map reference")
        pairs.append((index, table))
    return FunctionSpec(name=_name(item["name"]), insns=insns, relocations=tuple(pairs))


def _list(value: Any, most: int) -> list:
    if not isinstance(value, list) or len(value) > most:
        raise CompiledError("a list of the wrong type or length")
    return value


def _int(value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise CompiledError(f"a number out of range: {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_DESC:
        raise CompiledError("a description of the wrong type or length")
    return value


def _json_text(value: Any) -> str:
    """A type description: JSON (its ctypes type is built when the table is first used, typedesc.py)."""
    try:
        json.loads(_text(value))
    except (ValueError, RecursionError):
        raise CompiledError("a type description that is not JSON") from None
    return value


def _name(value: Any) -> bytes:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME or not value.isprintable():
        raise CompiledError(f"not a name: {value!r}")
    return value.encode()
