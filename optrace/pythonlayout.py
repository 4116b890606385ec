"""What the BPF Python walker (bpf/python.c) knows of one CPython process, and the bytes it captures of a
code object the first time a stack shows it.

frontend/runtimes/cpython/ finds the interpreter of a process and fills a :class:`PythonProcess`; bpf/pythonmaps.py
packs it into the walker's map. The walker replaces each native call of the interpreter's eval function
(``_PyEval_EvalFrameDefault``) by the Python frames that call was running: a frame word per Python frame
(:func:`python_frame_word`), the code object's address and the instruction (in code units). The first time
a stored stack holds a code object of a process, the walker copies the object's header and the objects it
names from (:data:`CAPTURE_PARTS`); frontend/runtimes/cpython/ decodes them with the process's layout, so a process
that has exited is still named.

Every offset here is a byte offset below :data:`MAX_OFFSET`: for 3.13+ they come from the process's own
``_Py_DebugOffsets`` (another user's memory), and the walker reads fixed windows (:data:`FRAME_WINDOW`
bytes of a frame) at them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from optrace.runtimeword import is_runtime_word, runtime_word, word_runtime

MAX_OFFSET = 0xFFFF  # any offset is below: a u16 in the walker's map, 0xFFFF meaning none (3.13's interpreter state is 7 KiB+)
FRAME_WINDOW = 128  # bytes of a frame the walker reads at once: every frame field lies below this
CODE_WINDOW = 256  # bytes of a code object captured: its name, file and line-table pointers lie below this

# How the frames of one native eval call are delimited (PythonLayout.entry_kind)
ENTRY_PER_CALL = 0  # 3.8-3.10: each native eval call runs exactly one Python frame (f_back links them)
ENTRY_FLAG = 1  # 3.11: the first frame of an eval call has a non-zero byte at frame_entry (is_entry)
ENTRY_SHIM = 2  # 3.12+: each eval call pushes a frame whose byte at frame_entry (owner) is entry_value or more

# What the frame's instruction field holds (PythonLayout.instr_kind)
INSTR_LASTI_BYTES = 0  # 3.8, 3.9: int f_lasti, a byte offset of the last instruction (-1 before the first)
INSTR_LASTI_UNITS = 1  # 3.10: int f_lasti, in code units
INSTR_POINTER = 2  # 3.11+: a pointer into the code object's co_code_adaptive (prev_instr, instr_ptr)

# How a code object maps instructions to lines (PythonLayout.linetable_kind)
LINES_LNOTAB = "lnotab"  # 3.8, 3.9: co_lnotab
LINES_310 = "linetable310"  # 3.10: co_linetable, PEP 626
LINES_LOCATIONS = "locations"  # 3.11+: co_linetable, Objects/locations.md


@dataclass(frozen=True)
class PythonLayout:
    """Byte offsets of the fields the walker and the capture read, for one CPython version (x86_64)."""

    version: tuple[int, int]  # (major, minor)
    # Finding the sampled thread's state: _PyRuntime.interpreters.head, then its list of thread states
    interpreters_head: int  # in _PyRuntime
    interp_threads_head: int  # in PyInterpreterState: tstate_head (<= 3.11), threads.head (3.12+)
    tstate_next: int
    tstate_thread_id: int  # unsigned long thread_id: pthread_self(), the thread's fs base on x86_64 glibc
    tstate_frame: int  # frame (3.8-3.10), cframe (3.11, 3.12), current_frame (3.13+)
    cframe_current_frame: int  # in _PyCFrame (3.11, 3.12); -1: tstate_frame points at the frame itself
    # The frame chain (PyFrameObject up to 3.10, _PyInterpreterFrame from 3.11): each below FRAME_WINDOW
    frame_previous: int  # f_back, previous
    frame_code: int  # f_code, f_executable
    frame_instr: int  # f_lasti, prev_instr, instr_ptr
    frame_entry: int  # the byte entry_kind looks at (is_entry, owner); -1 with ENTRY_PER_CALL
    entry_kind: int  # ENTRY_*
    entry_value: int  # ENTRY_SHIM: the lowest owner of an eval call's first frame (debugshapes.MinorConstants)
    instr_kind: int  # INSTR_*
    code_adaptive: int  # INSTR_POINTER: offset of co_code_adaptive in the code object, else 0
    code_tag_mask: int  # low bits of the frame's code pointer that are tags (3.14's _PyStackRef), else 0
    # The code object (each pointer below CODE_WINDOW)
    code_name: int  # co_name
    code_qualname: int  # co_qualname (3.11+), else co_name's offset
    code_filename: int  # co_filename
    code_linetable: int  # co_lnotab (3.8, 3.9), co_linetable (3.10+)
    code_firstlineno: int  # int co_firstlineno
    linetable_kind: str  # LINES_*
    # The objects names are read from
    unicode_length: int  # Py_ssize_t length in PyASCIIObject
    unicode_state: int  # the state bit field in PyASCIIObject (kind, compact, ascii)
    unicode_ascii_data: int  # sizeof(PyASCIIObject): where a compact ASCII string's characters start
    unicode_compact_data: int  # sizeof(PyCompactUnicodeObject): where other compact strings' data start
    bytes_size: int  # ob_size in PyBytesObject (PyVarObject)
    bytes_data: int  # ob_sval in PyBytesObject


@dataclass(frozen=True)
class PythonProcess:
    """One process's interpreter, as frontend/runtimes/cpython/ found it (the walker's map value, bpf/pythonmaps.py)."""

    pid: int
    version: str  # "3.11.2"
    path: str  # the file that holds _PyRuntime: the executable, or libpython
    runtime: int  # address of _PyRuntime in the process
    eval_ranges: tuple[tuple[int, int], ...]  # [start, end) in the process of the eval function; at most 2
    layout: PythonLayout


# The walker's capture of one code object (bpf/python.c struct py_capture): a header, then each part, the
# first bytes of the object it names (a part whose read failed is zeros, its bit set in ``failed``).
CAPTURE_HEADER = struct.Struct("<IIQ")  # pid, failed (bit i: part i unread), the code object's address
CAPTURE_PARTS: tuple[tuple[str, int], ...] = (
    ("code", CODE_WINDOW),  # the code object itself, from its start
    ("name", 160),  # the str objects co_name, co_qualname and co_filename, from their start
    ("qualname", 160),
    ("filename", 320),
    ("linetable", 1056),  # the bytes object co_linetable (co_lnotab), from its start
)
CAPTURE_SIZE = CAPTURE_HEADER.size + sum(size for _, size in CAPTURE_PARTS)

# A Python frame in a stored stack (bpf/python.c): a runtime's frame word (bit 62 set, bit 63 clear, the
# runtime's id in bits 56-59, docs/runtimes.md); the code object's address over 8 in bits 12-55, the
# instruction in code units (clamped) in bits 0-11.
PYTHON_RUNTIME_ID = 1
PYTHON_FRAME_BIT = runtime_word(PYTHON_RUNTIME_ID, 0)
PYTHON_CODE_SHIFT = 12
PYTHON_CODE_BITS = 44
PYTHON_INSTR_MASK = 0xFFF


def python_frame_word(code: int, instr: int) -> int:
    """The walker's frame word for a code object address and an instruction index (as python.c makes it)."""
    return (PYTHON_FRAME_BIT | ((code >> 3) & ((1 << PYTHON_CODE_BITS) - 1)) << PYTHON_CODE_SHIFT
            | min(max(instr, 0), PYTHON_INSTR_MASK))


def python_frame_parts(word: int) -> tuple[int, int]:
    """(code object address, instruction index) of a frame word."""
    return ((word >> PYTHON_CODE_SHIFT) & ((1 << PYTHON_CODE_BITS) - 1)) << 3, word & PYTHON_INSTR_MASK


def is_python_frame(word: int) -> bool:
    return is_runtime_word(word) and word_runtime(word) == PYTHON_RUNTIME_ID
