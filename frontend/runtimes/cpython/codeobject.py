"""A code object's names, file and line table, decoded from the walker's capture (CAPTURE_HEADER then
CAPTURE_PARTS, optrace/pythonlayout.py) or read from a live process (:func:`read_code`, the fallback when a
capture is missing), with the process's :class:`PythonLayout`.

Every byte is the process's: lengths are cut to what was captured or read, a name cut short ends with
:data:`TRUNCATED` ("…"), a name that cannot be decoded (a part that failed, a pointer to garbage, a string
that is not a compact one) is :data:`UNKNOWN_NAME`; a capture whose code object part failed gives None.
Nothing here raises on what the process wrote.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from optrace.frontend.runtimes.cpython.linetable import LineIndex
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.pythonlayout import CAPTURE_HEADER, CAPTURE_PARTS, CODE_WINDOW, PythonLayout

TRUNCATED = "…"
UNKNOWN_NAME = "[unknown]"
MAX_NAME_CHARS = 1024  # characters kept of a name or file read from a live process
# Bytes of a line table object kept from a live read: what a capture holds (issue 40: 64 KiB tables, read
# live for each of thousands of code objects, took a record minutes to decode and 64 KiB a code object)
LIVE_LINETABLE_BYTES = dict(CAPTURE_PARTS)["linetable"]
LIVE_STRING_BYTES = 4096  # bytes read of a str object at first (the header and up to ~4000 characters)
UNICODE_KINDS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}
MAX_LINE = 10_000_000  # a source file's lines: more is not a line number
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
POINTER_PARTS = ("name", "qualname", "filename", "linetable")  # the parts the code object points to


@dataclass(frozen=True)
class CodeInfo:
    """What a Python frame is named by. ``line(instr)`` gives 0 when the line is not known."""

    qualname: str
    name: str
    filename: str
    firstlineno: int
    linetable: bytes
    linetable_complete: bool  # False: the table was cut short (its later instructions have no line)
    linetable_kind: str
    # The table decoded once, at the first line asked: frame words name any instruction, new ones at every
    # sample if the process likes, and a daemon naming whole stacks every drain asks for the same ones again.
    _index: list[LineIndex] = field(default_factory=list, compare=False, repr=False)

    @property
    def indexed(self) -> bool:
        """Whether the table was decoded (its cost, about 0.5 ms a KiB, paid)."""
        return bool(self._index)

    def line(self, instr_units: int) -> int:
        """0 when not known; never outside 1..MAX_LINE (a garbage table gives no line rather than a wild one)."""
        if not self._index:
            self._index.append(LineIndex(self.linetable_kind, self.linetable, self.firstlineno,
                                         self.linetable_complete))
        found = self._index[0].line(instr_units)
        return found if found is not None and 0 < found <= MAX_LINE else 0


def decode_capture(capture: bytes, layout: PythonLayout) -> CodeInfo | None:
    """The CodeInfo of one capture of the walker (None when it is too short or its code part failed)."""
    if len(capture) < CAPTURE_HEADER.size:
        return None
    _pid, failed, _address = CAPTURE_HEADER.unpack_from(capture)
    parts: dict[str, bytes | None] = {}
    at = CAPTURE_HEADER.size
    for index, (name, size) in enumerate(CAPTURE_PARTS):
        data = capture[at:at + size]
        parts[name] = None if failed & (1 << index) or len(data) < size else data
        at += size
    return decode_parts(parts, layout)


def decode_parts(parts: dict[str, bytes | None], layout: PythonLayout) -> CodeInfo | None:
    """The CodeInfo of a code object's bytes (``parts["code"]``, from its start) and of the objects it points
    to (the other CAPTURE_PARTS names, each from the object's start; None: unread)."""
    code = parts.get("code")
    if code is None or len(code) < layout.code_firstlineno + 4:
        return None
    name = decode_str(parts.get("name"), layout)
    qualname = decode_str(parts.get("qualname"), layout) if layout.code_qualname != layout.code_name else name
    linetable = decode_bytes(parts.get("linetable"), layout)
    table, complete = linetable if linetable is not None else (b"", False)
    return CodeInfo(qualname=qualname or name or UNKNOWN_NAME, name=name or UNKNOWN_NAME,
                    filename=decode_str(parts.get("filename"), layout) or UNKNOWN_NAME,
                    firstlineno=first_line(code, layout), linetable=table,
                    linetable_complete=complete, linetable_kind=layout.linetable_kind)


def first_line(code: bytes, layout: PythonLayout) -> int:
    """co_firstlineno, 0 when it is not a line number (the bytes are another process's, maybe not a code
    object at all: a record must never hold a negative or wild line)."""
    value = _I32.unpack_from(code, layout.code_firstlineno)[0]
    return value if 0 < value <= MAX_LINE else 0


def pointers(code: bytes, layout: PythonLayout) -> dict[str, int]:
    """The addresses of the objects a code object's bytes name (0 where the bytes do not reach)."""
    offsets = {"name": layout.code_name, "qualname": layout.code_qualname, "filename": layout.code_filename,
               "linetable": layout.code_linetable}
    return {part: _U64.unpack_from(code, offset)[0] if 0 <= offset <= len(code) - 8 else 0
            for part, offset in offsets.items()}


def decode_str(data: bytes | None, layout: PythonLayout) -> str | None:
    """A compact str object's text from its first bytes (cut, with TRUNCATED, to what they hold); None when
    it is not a compact ASCII/latin-1/UCS-2/UCS-4 string."""
    if data is None or len(data) < max(layout.unicode_state + 4, layout.unicode_length + 8):
        return None
    length = _I64.unpack_from(data, layout.unicode_length)[0]
    state = _U32.unpack_from(data, layout.unicode_state)[0]
    kind, compact, ascii_only = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if length < 0 or not compact or kind not in UNICODE_KINDS or (ascii_only and kind != 1):
        return None
    start = layout.unicode_ascii_data if ascii_only else layout.unicode_compact_data
    count = min(length, max(0, len(data) - start) // kind, MAX_NAME_CHARS)
    text = data[start:start + count * kind].decode("ascii" if ascii_only else UNICODE_KINDS[kind], "replace")
    return text + TRUNCATED if count < length else text


def decode_bytes(data: bytes | None, layout: PythonLayout) -> tuple[bytes, bool] | None:
    """(the bytes held, whether they are all of them) of a bytes object from its first bytes; None when its
    header is unreadable or its size negative."""
    if data is None or len(data) < max(layout.bytes_size + 8, layout.bytes_data):
        return None
    size = _I64.unpack_from(data, layout.bytes_size)[0]
    if size < 0:
        return None
    held = data[layout.bytes_data:layout.bytes_data + size]
    return held, len(held) == size


def read_code(pid: int, address: int, layout: PythonLayout, memory: ProcessMemory | None = None) -> CodeInfo | None:
    """The CodeInfo of the code object at ``address`` in a live process, by bounded reads (None when the
    object itself cannot be read)."""
    memory = memory or ProcessMemory(pid)
    code = memory.read_exact(address, CODE_WINDOW)
    if code is None:
        return None
    targets = pointers(code, layout)
    first = memory.read_ranges([(targets[part], LIVE_STRING_BYTES) for part in POINTER_PARTS])
    parts: dict[str, bytes | None] = {"code": code, **{part: data or None for part, data in zip(POINTER_PARTS, first)}}
    parts["linetable"] = (parts["linetable"] or b"")[:LIVE_LINETABLE_BYTES] or None
    return decode_parts(parts, layout)
