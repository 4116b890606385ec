"""The layout of CPython 3.13+ from the interpreter's own ``_Py_DebugOffsets``: the first member of
``_PyRuntime`` (ELF section ``.PyRuntime``), a cookie ``xdebugpy``, ``PY_VERSION_HEX``, a ``free_threaded``
flag, then groups of uint64 offsets, most starting with their structure's size.

The struct is not stable across minor versions: its shape per minor (the groups and their members, in
order) is generated from each version's headers (:mod:`~optrace.frontend.runtimes.cpython.debugshapes`). The bytes
are read from the process at attach time and are the process's to choose: :func:`parse_debug_offsets`
checks the cookie, that the version agrees with what the file said, that the build has a GIL, that every
offset the walker uses is below MAX_OFFSET and below its structure's size, that the frame fields lie in
FRAME_WINDOW and the code object's pointers in CODE_WINDOW, and that the fixed facts of x86_64 hold
(PyObject is 16 bytes with ob_type at 8, a bytes object's ob_size at 16); anything else is a refusal with
its reason.

A minor newer than the shapes known (3.16+) is read with each known shape, newest first, and the first
that passes every check is taken (with the newest minor's constants): a table that only grew at its end,
or kept an older shape, needs nothing new; one that grew in the middle shifts the later groups, fails the
fixed facts with every shape, and is refused until scripts/python_layouts.py has read its headers.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from optrace.frontend.runtimes.cpython.debugshapes import CONSTANTS, SHAPES, MinorConstants, Shape
from optrace.frontend.runtimes.cpython.layouts import ThreadOffsets
from optrace.pythonlayout import (CODE_WINDOW, ENTRY_SHIM, FRAME_WINDOW, INSTR_POINTER, LINES_LOCATIONS, MAX_OFFSET,
                                  PythonLayout)

COOKIE = b"xdebugpy"
_HEADER = struct.Struct("<8sQQ")  # cookie, version (PY_VERSION_HEX), free_threaded
NEWEST_SHAPE = max(SHAPES)
TRUNCATED = "debug offsets truncated"
MAX_SIZE = 1 << 24  # a structure size in the table (sizeof(_PyRuntimeState) is about 280 KiB in 3.13)
PYOBJECT = (16, 8)  # sizeof(PyObject), offsetof(ob_type) of a GIL build on x86_64
VAR_OBJECT_SIZE = 16  # offsetof(PyVarObject, ob_size)


def shape_size(shape: Shape) -> int:
    return _HEADER.size + 8 * sum(len(members) for _, members in shape)


READ_SIZE = max(shape_size(shape) for shape in SHAPES.values())  # bytes to read at _PyRuntime


@dataclass(frozen=True)
class DebugOffsets:
    """What a process's _Py_DebugOffsets says, as optrace uses it."""

    version: tuple[int, int, int]  # major, minor, micro (PY_VERSION_HEX)
    version_hex: int
    layout: PythonLayout
    threads: ThreadOffsets


def version_of_hex(version_hex: int) -> tuple[int, int, int]:
    return version_hex >> 24 & 0xFF, version_hex >> 16 & 0xFF, version_hex >> 8 & 0xFF


def parse_debug_offsets(data: bytes, expected: tuple[int, int] | None = None) -> DebugOffsets | str:
    """The layout ``data`` (the first READ_SIZE bytes of _PyRuntime) describes, or why it is refused.
    ``expected``: the (major, minor) the file says (Py_Version, its name)."""
    if len(data) < _HEADER.size:
        return TRUNCATED
    cookie, version_hex, free_threaded = _HEADER.unpack_from(data)
    if cookie != COOKIE:
        return "no debug offsets cookie"
    version = version_of_hex(version_hex)
    if expected is not None and version[:2] != expected:
        return f"debug offsets say {version[0]}.{version[1]}, the file {expected[0]}.{expected[1]}"
    if version[0] != 3 or version[1] < min(SHAPES):
        return f"debug offsets of python {version[0]}.{version[1]} not supported"
    if free_threaded:
        return "free-threaded build"
    table = _first_table(data, version[1])
    if isinstance(table, str):
        return table if table == TRUNCATED else f"debug offsets of {version[0]}.{version[1]} refused: {table}"
    constants = CONSTANTS.get(version[1], CONSTANTS[NEWEST_SHAPE])
    return DebugOffsets(version, version_hex, _layout(version[:2], table, constants),
                        ThreadOffsets(table["thread_state"]["interp"], table["thread_state"]["native_thread_id"]))


def _first_table(data: bytes, minor: int) -> dict[str, dict[str, int]] | str:
    """``data`` read with the minor's shape, or (a newer minor) with the first known shape, newest first, that
    passes the checks; else the newest shape's problem."""
    minors = [minor] if minor in SHAPES else sorted(SHAPES, reverse=True)
    problems = []
    for shape in (SHAPES[known] for known in minors):
        table = _unpack(data, shape) if len(data) >= shape_size(shape) else None
        problem = _problem(table) if table else TRUNCATED
        if problem is None:
            return table
        problems.append(problem)
    return problems[0]


def _unpack(data: bytes, shape: Shape) -> dict[str, dict[str, int]]:
    values = iter(struct.unpack_from(f"<{shape_size(shape) // 8 - 3}Q", data, _HEADER.size))
    return {group: {member: next(values) for member in members} for group, members in shape}


# The offsets the layout takes, by group: the bytes each field spans, and the window it must lie in (the walker
# reads a frame's and a code object's fields from one read of FRAME_WINDOW and CODE_WINDOW bytes; None: any
# offset the walker can use, below MAX_OFFSET)
_USED: dict[str, dict[str, tuple[int, int | None]]] = {
    "runtime_state": {"interpreters_head": (8, None)},
    "interpreter_state": {"threads_head": (8, None)},
    "thread_state": {field: (8, None)
                     for field in ("next", "interp", "current_frame", "thread_id", "native_thread_id")},
    "interpreter_frame": {"previous": (8, FRAME_WINDOW), "executable": (8, FRAME_WINDOW),
                          "instr_ptr": (8, FRAME_WINDOW), "owner": (1, FRAME_WINDOW)},
    "code_object": {"filename": (8, CODE_WINDOW), "name": (8, CODE_WINDOW), "qualname": (8, CODE_WINDOW),
                    "linetable": (8, CODE_WINDOW), "firstlineno": (4, CODE_WINDOW), "co_code_adaptive": (2, None)},
    "bytes_object": {"ob_size": (8, None), "ob_sval": (1, None)},
    "unicode_object": {"state": (4, None), "length": (8, None)},
}


def _problem(table: dict[str, dict[str, int]]) -> str | None:
    """What is wrong with a parsed table (None: nothing)."""
    if (table["pyobject"]["size"], table["pyobject"]["ob_type"]) != PYOBJECT:
        return "PyObject is not 16 bytes with ob_type at 8"
    if table["bytes_object"]["ob_size"] != VAR_OBJECT_SIZE:
        return "PyBytesObject.ob_size is not at 16"
    unicode = table["unicode_object"]
    if not 0 < unicode["asciiobject_size"] <= unicode.get("compactunicodeobject_size", 255) < 256:
        return "sizeof(PyASCIIObject) out of range"
    for group, fields in _USED.items():
        size = table[group]["size"]
        if not 0 < size <= MAX_SIZE:
            return f"{group} size {size} out of range"
        for field, (span, window) in fields.items():
            if table[group][field] + span > min(size, window or MAX_OFFSET):
                return f"{group}.{field} = {table[group][field]} out of range"
    return None


def _layout(version: tuple[int, int], table: dict[str, dict[str, int]], constants: MinorConstants) -> PythonLayout:
    code, frame, unicode = table["code_object"], table["interpreter_frame"], table["unicode_object"]
    return PythonLayout(
        version=version, interpreters_head=table["runtime_state"]["interpreters_head"],
        interp_threads_head=table["interpreter_state"]["threads_head"], tstate_next=table["thread_state"]["next"],
        tstate_thread_id=table["thread_state"]["thread_id"], tstate_frame=table["thread_state"]["current_frame"],
        cframe_current_frame=-1, frame_previous=frame["previous"], frame_code=frame["executable"],
        frame_instr=frame["instr_ptr"], frame_entry=frame["owner"], entry_kind=ENTRY_SHIM,
        entry_value=constants.entry_owner, instr_kind=INSTR_POINTER, code_adaptive=code["co_code_adaptive"],
        code_tag_mask=constants.code_tag_mask, code_name=code["name"], code_qualname=code["qualname"],
        code_filename=code["filename"], code_linetable=code["linetable"], code_firstlineno=code["firstlineno"],
        linetable_kind=LINES_LOCATIONS, unicode_length=unicode["length"], unicode_state=unicode["state"],
        unicode_ascii_data=unicode["asciiobject_size"],
        unicode_compact_data=unicode.get("compactunicodeobject_size",
                                         unicode["asciiobject_size"] + constants.compact_extra),
        bytes_size=table["bytes_object"]["ob_size"], bytes_data=table["bytes_object"]["ob_sval"])
