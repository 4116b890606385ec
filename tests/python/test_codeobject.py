"""Naming code objects (frontend/runtimes/cpython/codeobject.py): read from live interpreters of every version (names of
every str kind), decoded from captures made as bpf/python.c makes them, and from hostile bytes."""
from __future__ import annotations

import ctypes
import json
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from optrace.frontend.runtimes.cpython.codeobject import (LIVE_LINETABLE_BYTES, LIVE_STRING_BYTES, MAX_NAME_CHARS,
                                                          TRUNCATED, UNKNOWN_NAME, decode_capture, pointers,
                                                          read_code)
from optrace.frontend.runtimes.cpython.interpreter import find_interpreter
from optrace.frontend.runtimes.cpython.layouts import table_layout
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.procfs import read_maps
from optrace.pythonlayout import CAPTURE_HEADER, CAPTURE_PARTS, CAPTURE_SIZE, CODE_WINDOW, PythonLayout
from pythons import PROGRAMS, SUPPORTED, child, command


def capture_of(pid: int, address: int, layout: PythonLayout) -> bytes:
    """The capture bpf/python.c makes: the code object's first CODE_WINDOW bytes, then the first bytes of each
    object it points to (a part that cannot be read whole is zeros, its bit set)."""
    memory = ProcessMemory(pid)
    code = memory.read_exact(address, CODE_WINDOW)
    targets = pointers(code, layout)
    parts, failed = [code], 0
    for index, (name, size) in enumerate(CAPTURE_PARTS[1:], start=1):
        data = memory.read_exact(targets[name], size)
        failed |= (data is None) << index
        parts.append(data or bytes(size))
    return CAPTURE_HEADER.pack(pid, failed, address) + b"".join(parts)


def cut(text: str, layout: PythonLayout, part_size: int) -> str:
    """``text`` as a capture part of ``part_size`` bytes holds it."""
    ascii_only = all(ord(c) < 128 for c in text)
    width = 1 if ascii_only else max(1 if ord(c) < 256 else 2 if ord(c) < 65536 else 4 for c in text)
    room = (part_size - (layout.unicode_ascii_data if ascii_only else layout.unicode_compact_data)) // width
    return text if len(text) <= room else text[:room] + TRUNCATED


@pytest.mark.parametrize("name", SUPPORTED)
def test_code_objects_of_a_live_interpreter(name):
    with child([*command(name), str(PROGRAMS / "names.py")], lines=1) as (proc, (line,)):
        process = find_interpreter(proc.pid, [entry for entry in read_maps(proc.pid).entries if entry.executable])
        assert not isinstance(process, str), process
        sizes = dict(CAPTURE_PARTS)
        for described in json.loads(line).values():
            info = read_code(proc.pid, described["address"], process.layout)
            assert (info.name, info.qualname, info.filename, info.firstlineno) == (
                described["name"], described["qualname"], described["filename"], described["firstlineno"])
            assert info.linetable and info.linetable_complete
            captured = decode_capture(capture_of(proc.pid, described["address"], process.layout), process.layout)
            assert (captured.name, captured.qualname, captured.filename, captured.firstlineno) == (
                cut(described["name"], process.layout, sizes["name"]),
                cut(described["qualname"], process.layout, sizes["qualname"]),
                cut(described["filename"], process.layout, sizes["filename"]), described["firstlineno"])
            assert captured.linetable == info.linetable  # all of them fit in the capture's part


LAYOUT = table_layout((3, 11))


class FakeObjects:
    """Objects laid out in this process's memory the way 3.11 lays them out (held alive by the instance)."""

    def __init__(self) -> None:
        self.buffers: list[ctypes.Array] = []

    def place(self, data: bytes) -> int:
        buffer = ctypes.create_string_buffer(data, len(data) + 8)
        self.buffers.append(buffer)
        return ctypes.addressof(buffer)

    def ascii_str(self, text: bytes, claimed: int) -> int:
        header = bytearray(LAYOUT.unicode_ascii_data)
        struct.pack_into("<q", header, LAYOUT.unicode_length, claimed)
        struct.pack_into("<I", header, LAYOUT.unicode_state, 1 << 2 | 1 << 5 | 1 << 6)  # kind 1, compact, ascii
        return self.place(bytes(header) + text)

    def bytes_object(self, data: bytes, claimed: int) -> int:
        header = bytearray(LAYOUT.bytes_data)
        struct.pack_into("<q", header, LAYOUT.bytes_size, claimed)
        return self.place(bytes(header) + data)

    def code(self, name: int, filename: int, linetable: int, firstlineno: int = 7) -> int:
        code = bytearray(CODE_WINDOW)
        for offset, value in ((LAYOUT.code_name, name), (LAYOUT.code_qualname, name),
                              (LAYOUT.code_filename, filename), (LAYOUT.code_linetable, linetable)):
            struct.pack_into("<Q", code, offset, value)
        struct.pack_into("<i", code, LAYOUT.code_firstlineno, firstlineno)
        return self.place(bytes(code))


def test_a_string_claiming_a_gigabyte_is_read_bounded():
    fake = FakeObjects()
    name = fake.ascii_str(b"x" * 6000, claimed=1 << 30)
    table = fake.bytes_object(b"\x80" * 70000, claimed=1 << 40)
    info = read_code(os.getpid(), fake.code(name, name, table), LAYOUT)
    assert info.name == "x" * min(LIVE_STRING_BYTES - LAYOUT.unicode_ascii_data, MAX_NAME_CHARS) + TRUNCATED
    assert len(info.linetable) == LIVE_LINETABLE_BYTES - LAYOUT.bytes_data and not info.linetable_complete
    assert info.line(500) == 7 and info.line(40_000) == 0  # 2-byte entries of one unit; past the cut: unknown


def test_pointers_to_nowhere_give_placeholders():
    fake = FakeObjects()
    info = read_code(os.getpid(), fake.code(name=8, filename=0xDEAD0000, linetable=0), LAYOUT)
    assert (info.name, info.qualname, info.filename, info.firstlineno) == (UNKNOWN_NAME, UNKNOWN_NAME,
                                                                          UNKNOWN_NAME, 7)
    assert info.linetable == b"" and info.line(3) == 0
    assert read_code(os.getpid(), 16, LAYOUT) is None


def test_a_capture_with_failed_parts():
    fake = FakeObjects()
    name = fake.ascii_str(b"named", claimed=5)
    address = fake.code(name, name, 0)
    capture = bytearray(capture_of(os.getpid(), address, LAYOUT))
    assert decode_capture(bytes(capture), LAYOUT).name == "named"
    struct.pack_into("<I", capture, 4, 1 << 1)  # the name part failed
    assert decode_capture(bytes(capture), LAYOUT).name == UNKNOWN_NAME
    assert decode_capture(bytes(capture[:CAPTURE_SIZE - 1]), LAYOUT).name == UNKNOWN_NAME  # a short line table
    struct.pack_into("<I", capture, 4, 1)  # the code part failed
    assert decode_capture(bytes(capture), LAYOUT) is None
    assert decode_capture(bytes(capture[:10]), LAYOUT) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=CAPTURE_SIZE, max_size=CAPTURE_SIZE), st.sampled_from([(3, 8), (3, 10), (3, 11), (3, 12)]))
def test_garbage_captures_never_raise(capture, version):
    layout = table_layout(version)
    info = decode_capture(capture, layout)
    if info is not None:
        assert isinstance(info.line(5), int) and isinstance(info.name, str)


def test_a_garbage_first_line_or_table_never_gives_a_negative_or_wild_line() -> None:
    """A capture of something that is not a code object (an address reused, a faked interpreter) must give
    line 0, never a negative number: a record holding one is refused as corrupt when it is read."""
    from optrace.frontend.runtimes.cpython.codeobject import CodeInfo, first_line
    from optrace.frontend.runtimes.cpython.layouts import table_layout

    layout = table_layout((3, 11))
    code = bytearray(256)
    code[layout.code_firstlineno:layout.code_firstlineno + 4] = (-1927804712).to_bytes(4, "little", signed=True)
    assert first_line(bytes(code), layout) == 0
    info = CodeInfo("f", "f", "/x.py", -246, b"\xff" * 32, True, layout.linetable_kind)
    assert all(info.line(instr) >= 0 for instr in range(64))
