"""The layout of CPython 3.13+ from the interpreter's own ``_Py_DebugOffsets``: the first member of
``_PyRuntime`` (ELF section ``.PyRuntime``), a cookie ``xdebugpy``, ``PY_VERSION_HEX``, a ``free_threaded``
flag, then groups of uint64 offsets, each group starting with its structure's size.

The struct is not stable across minor versions, so its shape (the groups and their members, in order) is
kept here per minor, from the headers: 3.13's ``Include/internal/pycore_runtime.h`` (584 bytes; v3.13.0's, as
installed with that interpreter) and 3.14's ``Include/internal/pycore_debug_offsets.h`` (760 bytes: the size
the 3.14 readers of py-spy and PTVS report; transcribed from a 3.14-line copy of the header, the v3.14.0 tag
itself could not be fetched here, and no 3.14 interpreter is installed to check it live). The bytes are read from the
process at attach time and are the process's to choose: :func:`parse_debug_offsets` checks the cookie,
that the version agrees with what the file said, that the build has a GIL, that every offset the walker
uses is below MAX_OFFSET and below its structure's size, that the frame fields lie in FRAME_WINDOW and the
code object's pointers in CODE_WINDOW, and that the fixed facts of x86_64 hold (PyObject is 16 bytes with
ob_type at 8, a bytes object's ob_size at 16); anything else is a refusal with its reason.

An unknown newer minor (3.15+) is parsed with the newest known shape and that minor's constants, and
accepted only if everything above holds: a struct that grew in the middle (as 3.15's did, in
``thread_state``) shifts the later groups, which then fail the fixed facts, and is refused.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from optrace.frontend.python.layouts import ThreadOffsets
from optrace.pythonlayout import (CODE_WINDOW, ENTRY_SHIM, FRAME_WINDOW, INSTR_POINTER, LINES_LOCATIONS, MAX_OFFSET,
                                  PythonLayout)

COOKIE = b"xdebugpy"
_HEADER = struct.Struct("<8sQQ")  # cookie, version (PY_VERSION_HEX), free_threaded

Shape = tuple[tuple[str, tuple[str, ...]], ...]  # (group, its members) in order
_RUNTIME = ("runtime_state", ("size", "finalizing", "interpreters_head"))
_INTERP_313 = ("size", "id", "next", "threads_head", "gc", "imports_modules", "sysdict", "builtins", "ceval_gil",
               "gil_runtime_state", "gil_runtime_state_enabled", "gil_runtime_state_locked", "gil_runtime_state_holder")
_THREAD = ("thread_state", ("size", "prev", "next", "interp", "current_frame", "thread_id", "native_thread_id",
                            "datastack_chunk", "status"))
_FRAME_313 = ("size", "previous", "executable", "instr_ptr", "localsplus", "owner")
_CODE_313 = ("size", "filename", "name", "qualname", "linetable", "firstlineno", "argcount", "localsplusnames",
             "localspluskinds", "co_code_adaptive")
_OBJECTS = (("pyobject", ("size", "ob_type")), ("type_object", ("size", "tp_name", "tp_repr", "tp_flags")),
            ("tuple_object", ("size", "ob_item", "ob_size")), ("list_object", ("size", "ob_item", "ob_size")))
_SET = (("set_object", ("size", "used", "table", "mask")),)  # 3.14: after list_object
_MORE_OBJECTS = (("dict_object", ("size", "ma_keys", "ma_values")), ("float_object", ("size", "ob_fval")),
                 ("long_object", ("size", "lv_tag", "ob_digit")), ("bytes_object", ("size", "ob_size", "ob_sval")),
                 ("unicode_object", ("size", "state", "length", "asciiobject_size")), ("gc", ("size", "collecting")))
_SHAPE_313: Shape = (_RUNTIME, ("interpreter_state", _INTERP_313), _THREAD, ("interpreter_frame", _FRAME_313),
                     ("code_object", _CODE_313), *_OBJECTS, *_MORE_OBJECTS)
_SHAPE_314: Shape = (
    _RUNTIME,
    ("interpreter_state", (*_INTERP_313[:4], "threads_main", *_INTERP_313[4:], "code_object_generation",
                           "tlbc_generation")),
    _THREAD,
    ("interpreter_frame", (*_FRAME_313, "stackpointer", "tlbc_index")),
    ("code_object", (*_CODE_313, "co_tlbc")),
    *_OBJECTS, *_SET, *_MORE_OBJECTS,
    ("gen_object", ("size", "gi_name", "gi_iframe", "gi_frame_state")),
    ("llist_node", ("next", "prev")),
    ("debugger_support", ("eval_breaker", "remote_debugger_support", "remote_debugging_enabled",
                          "debugger_pending_call", "debugger_script_path", "debugger_script_path_size")),
)
SHAPES = {13: _SHAPE_313, 14: _SHAPE_314}
NEWEST_SHAPE = max(SHAPES)


@dataclass(frozen=True)
class MinorConstants:
    """What _Py_DebugOffsets does not say, from the headers of the minor version."""

    cstack_owner: int  # FRAME_OWNED_BY_CSTACK (enum _frameowner)
    code_tag_mask: int  # tag bits of f_executable
    compact_extra: int  # sizeof(PyCompactUnicodeObject) - sizeof(PyASCIIObject): utf8_length and utf8


CONSTANTS = {
    # v3.13.0 Include/internal/pycore_frame.h: FRAME_OWNED_BY_CSTACK = 3; f_executable is a PyObject *;
    # Include/cpython/unicodeobject.h: PyCompactUnicodeObject adds Py_ssize_t utf8_length and char *utf8
    13: MinorConstants(cstack_owner=3, code_tag_mask=0, compact_extra=16),
    # v3.14.0 Include/internal/pycore_interpframe_structs.h: FRAME_OWNED_BY_INTERPRETER = 3 was inserted,
    # FRAME_OWNED_BY_CSTACK = 4; f_executable is a _PyStackRef whose low bits are tags (pycore_stackref.h:
    # bit 0 the reference tag, 0b11 a tagged int, never a code object; objects are 16-byte aligned, so masking
    # 0b11 only drops tags); PyCompactUnicodeObject as in 3.13
    14: MinorConstants(cstack_owner=4, code_tag_mask=3, compact_extra=16),
}
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
        return "debug offsets truncated"
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
    shape = SHAPES.get(version[1], SHAPES[NEWEST_SHAPE])
    if len(data) < shape_size(shape):
        return "debug offsets truncated"
    table = _unpack(data, shape)
    problem = _problem(table)
    if problem:
        return f"debug offsets of {version[0]}.{version[1]} refused: {problem}"
    constants = CONSTANTS.get(version[1], CONSTANTS[NEWEST_SHAPE])
    return DebugOffsets(version, version_hex, _layout(version[:2], table, constants),
                        ThreadOffsets(table["thread_state"]["interp"], table["thread_state"]["native_thread_id"]))


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
    if not 0 < table["unicode_object"]["asciiobject_size"] < 256:
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
        entry_value=constants.cstack_owner, instr_kind=INSTR_POINTER, code_adaptive=code["co_code_adaptive"],
        code_tag_mask=constants.code_tag_mask, code_name=code["name"], code_qualname=code["qualname"],
        code_filename=code["filename"], code_linetable=code["linetable"], code_firstlineno=code["firstlineno"],
        linetable_kind=LINES_LOCATIONS, unicode_length=unicode["length"], unicode_state=unicode["state"],
        unicode_ascii_data=unicode["asciiobject_size"],
        unicode_compact_data=unicode["asciiobject_size"] + constants.compact_extra,
        bytes_size=table["bytes_object"]["ob_size"], bytes_data=table["bytes_object"]["ob_sval"])
