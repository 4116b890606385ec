"""bpf/compiled.py and bpf/typedesc.py: a stored program's description is read back exactly, and anything
that is not a sound description (a relocation that points at no map reference or names no map, a function
outside the entry, a type of no known shape) is refused with one error type. No BPF needed."""
from __future__ import annotations

import ctypes
import json
import struct

import pytest

from optrace.bpf.compiled import (INSN, LENGTH, CompiledError, CompiledProgram, FunctionSpec, TableSpec, decode, encode,
                                  relocated, relocations)
from optrace.bpf.typedesc import TypeDescError, decode_type, event_type

MAP_FD = 7


def insn(code: int, dst: int = 0, src: int = 0, offset: int = 0, imm: int = 0) -> bytes:
    return INSN.pack(code, dst | src << 4, offset, imm)


# r1 = map (fd 7); r0 = 0; exit
PROGRAM_INSNS = insn(0x18, 1, 1, imm=MAP_FD) + insn(0) + insn(0xB7) + insn(0x95)
TABLE = TableSpec(b"counts", 1, 4, 8, 128, 0, '"unsigned int"', '"unsigned long long"')


def program(**changes) -> CompiledProgram:
    fields = dict(license=b"GPL", kern_version=0, tables=(TABLE,),
                  functions=(FunctionSpec(b"count", PROGRAM_INSNS, relocations(PROGRAM_INSNS, {MAP_FD: 0})),),
                  kernel_offsets=(2, 96))
    return CompiledProgram(**{**fields, **changes})


def reencoded(edit) -> bytes:
    """The payload of :func:`program` with its description edited."""
    payload = encode(program())
    (length,) = LENGTH.unpack_from(payload)
    description = json.loads(payload[LENGTH.size:LENGTH.size + length])
    edit(description)
    text = json.dumps(description).encode()
    return LENGTH.pack(len(text)) + text + payload[LENGTH.size + length:]


def test_a_program_reads_back_as_it_was_written():
    assert decode(encode(program())) == program()
    assert program().functions[0].relocations == ((0, 0),)


def test_relocation_puts_this_processes_fd_in_the_instruction():
    code = relocated(program().functions[0], [42])
    assert INSN.unpack_from(code, 0)[3] == 42 and code[8:] == PROGRAM_INSNS[8:]


def test_an_fd_of_no_map_or_another_reference_is_not_kept():
    with pytest.raises(CompiledError, match="not a map"):
        relocations(PROGRAM_INSNS, {})
    with pytest.raises(CompiledError, match="reference"):
        relocations(insn(0x18, 1, 4, imm=3) + insn(0), {3: 0})  # BPF_PSEUDO_FUNC


@pytest.mark.parametrize("edit, problem", [
    (lambda d: d["functions"][0].update(relocations=[[2, 0]]), "no map reference"),
    (lambda d: d["functions"][0].update(relocations=[[0, 1]]), "names no map"),
    (lambda d: d["functions"][0].update(relocations=[[3, 0]]), "outside"),
    (lambda d: d["functions"][0].update(size=40), "within the entry"),
    (lambda d: d["functions"][0].update(offset=4), "within the entry"),
    (lambda d: d["tables"][0].update(max_entries=True), "out of range"),
    (lambda d: d["tables"][0].update(key_size=-1), "out of range"),
    (lambda d: d.update(tables={}), "wrong type"),
    (lambda d: d.pop("license"), "not a stored program"),
    (lambda d: d.update(license="GPL\n"), "not a name"),
])
def test_an_unsound_description_is_refused(edit, problem):
    with pytest.raises(CompiledError, match=problem):
        decode(reencoded(edit))


def test_a_payload_that_is_not_a_description_is_refused():
    for payload in (b"", b"\x01\x00", LENGTH.pack(1 << 30) + b"{}", LENGTH.pack(2) + b"{x",
                    LENGTH.pack(4000) + b"[" * 2000 + b"]" * 2000):
        with pytest.raises(CompiledError):
            decode(payload)


def test_types_are_bccs():
    key = decode_type(["key_t", [["pid", "unsigned int"], ["", [["a", "int"], ["b", "unsigned int"]], "union"],
                                 ["comm", "char", [16]], ["bits", "unsigned int", 3]], "struct"])
    assert ctypes.sizeof(key) == 4 + 4 + 16 + 4
    value = key(pid=5)
    value.a = -1
    assert (value.pid, value.b) == (5, 0xFFFFFFFF)  # the unnamed union's members read as the struct's
    packed = decode_type(["p", [["x", "char"], ["y", "unsigned long long"]], "struct_packed"])
    assert ctypes.sizeof(packed) == 9
    event = event_type(["kind#u32", "pid#u32", "filename#char[256]"])
    assert ctypes.sizeof(event) == 264 and event.filename.offset == 8


@pytest.mark.parametrize("desc", ["float128", ["x", [["a", "nope"]], "struct"], ["x", [["a", "int", "bits"]]],
                                  ["x", [["a", "int", [-1]]]], ["x", [["a", "int", 65]]], ["x", "int", "struct"],
                                  ["x", [["a", "int"]], "class"], 5, None])
def test_a_type_of_no_known_shape_is_refused(desc):
    with pytest.raises(TypeDescError):
        decode_type(desc)


def test_nesting_is_bounded():
    desc: object = "int"
    for depth in range(100):
        desc = [f"s{depth}", [["m", desc]], "struct"]
    with pytest.raises(TypeDescError):
        decode_type(desc)


def test_an_event_field_of_no_known_type_is_refused():
    for fields in (["x#struct foo"], ["nohash"], ["a#char[99999999]"], [3]):
        with pytest.raises(TypeDescError):
            event_type(fields)


def test_instruction_layout():
    assert INSN.size == 8 and struct.calcsize("<BBhi") == 8
