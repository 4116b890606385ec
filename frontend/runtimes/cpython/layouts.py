"""The hand-kept layouts of CPython 3.8-3.12 (x86_64, release builds, GIL): :data:`MEASURED` is the output of
``scripts/python_layouts.py``, which compiles offsetof()s against each interpreter's own headers (pyenv's
3.8.18, 3.9.18, 3.10.13, 3.11.7, 3.12.1 and Debian's 3.11.2, which agree with pyenv's 3.11.7 field for
field); tests/python/test_layouts.py measures again where the headers exist. 3.13 and later describe
themselves (:mod:`optrace.frontend.runtimes.cpython.debugoffsets`); 3.7 and older are refused.

What the headers say in words rather than offsets is in :data:`_KINDS`:

- 3.8-3.10 (``Include/cpython/frameobject.h``): a ``PyFrameObject`` per eval call, ``f_lasti`` in bytes
  (3.8, 3.9) or code units (3.10); lines from ``co_lnotab`` (3.8, 3.9) or ``co_linetable`` (3.10).
- 3.11 (``Include/internal/pycore_frame.h``): ``_PyInterpreterFrame`` through ``tstate->cframe->current_frame``;
  the first frame of an eval call has ``is_entry`` set; ``prev_instr`` points into ``co_code_adaptive``.
- 3.12: the same chain, but each eval call pushes a shim frame whose ``owner`` is ``FRAME_OWNED_BY_CSTACK``
  (3 in 3.12.1's ``enum _frameowner``; measured, like the offsets).
"""
from __future__ import annotations

from dataclasses import dataclass

from optrace.pythonlayout import (ENTRY_FLAG, ENTRY_PER_CALL, ENTRY_SHIM, INSTR_LASTI_BYTES, INSTR_LASTI_UNITS,
                                  INSTR_POINTER, LINES_310, LINES_LNOTAB, LINES_LOCATIONS, PythonLayout)

OLDEST = (3, 8)
NEWEST_IN_TABLE = (3, 12)

# scripts/python_layouts.py's output: offsets in bytes (entry_value is FRAME_OWNED_BY_CSTACK's value)
COLUMNS = ("interpreters_head", "interp_threads_head", "tstate_next", "tstate_thread_id", "tstate_interp",
           "tstate_native_thread_id", "tstate_frame", "cframe_current_frame", "frame_previous", "frame_code",
           "frame_instr", "frame_entry", "entry_value", "code_adaptive", "code_name", "code_qualname",
           "code_filename", "code_linetable", "code_firstlineno", "unicode_length", "unicode_state",
           "unicode_ascii_data", "unicode_compact_data", "bytes_size", "bytes_data")
MEASURED: dict[tuple[int, int], tuple[int | None, ...]] = {  # by COLUMNS (None: no such field)
    (3, 8): (32, 8, 8, 176, 16, None, 24, None, 24, 32, 104, None, None, None, 112, 112, 104, 120, 40, 16, 32, 48,
              72, 16, 32),
    (3, 9): (32, 8, 8, 176, 16, None, 24, None, 24, 32, 104, None, None, None, 112, 112, 104, 120, 40, 16, 32, 48,
              72, 16, 32),
    (3, 10): (32, 8, 8, 176, 16, None, 24, None, 24, 32, 96, None, None, None, 112, 112, 104, 120, 40, 16, 32, 48,
              72, 16, 32),
    (3, 11): (40, 16, 8, 152, 16, 160, 56, 8, 48, 32, 56, 68, None, 184, 120, 128, 112, 136, 72, 16, 32, 48, 72,
              16, 32),
    (3, 12): (40, 72, 8, 136, 16, 144, 56, 0, 8, 0, 56, 70, 3, 192, 120, 128, 112, 136, 68, 16, 32, 40, 56, 16, 32),
}

_KINDS: dict[tuple[int, int], dict[str, int | str]] = {
    (3, 8): {"entry_kind": ENTRY_PER_CALL, "instr_kind": INSTR_LASTI_BYTES, "linetable_kind": LINES_LNOTAB},
    (3, 9): {"entry_kind": ENTRY_PER_CALL, "instr_kind": INSTR_LASTI_BYTES, "linetable_kind": LINES_LNOTAB},
    (3, 10): {"entry_kind": ENTRY_PER_CALL, "instr_kind": INSTR_LASTI_UNITS, "linetable_kind": LINES_310},
    (3, 11): {"entry_kind": ENTRY_FLAG, "instr_kind": INSTR_POINTER, "linetable_kind": LINES_LOCATIONS},
    (3, 12): {"entry_kind": ENTRY_SHIM, "instr_kind": INSTR_POINTER, "linetable_kind": LINES_LOCATIONS},
}
# Fields a version's headers do not have (3.8-3.10: no cframe, no entry byte, no co_code_adaptive)
_ABSENT = {"cframe_current_frame": -1, "frame_entry": -1, "entry_value": 0, "code_adaptive": 0, "code_tag_mask": 0}


@dataclass(frozen=True)
class ThreadOffsets:
    """Thread-state fields user space reads beyond the walker's contract: the layout check follows
    ``interp`` back to the interpreter, the reference walker matches ``native_thread_id`` (3.11+)."""

    tstate_interp: int
    tstate_native_thread_id: int  # -1 before 3.11 (the field does not exist)


def unsupported(version: tuple[int, int]) -> str | None:
    """Why a version is refused before anything is read (None: supported, from the table or its own offsets)."""
    if version < OLDEST:
        return f"python {version[0]}.{version[1]} not supported"
    return None


def measured(version: tuple[int, int]) -> dict[str, int]:
    """The table's row of a version as {field: offset}, the fields it has only ({} when not in the table)."""
    return {name: value for name, value in zip(COLUMNS, MEASURED.get(version, ())) if value is not None}


def table_layout(version: tuple[int, int]) -> PythonLayout | None:
    """The hand-kept layout of a 3.8-3.12 interpreter (None for any other version)."""
    if version not in MEASURED:
        return None
    fields = {**_ABSENT, **measured(version), **_KINDS[version]}
    fields.pop("tstate_interp")
    fields.pop("tstate_native_thread_id", None)
    return PythonLayout(version=version, **fields)


def table_thread_offsets(version: tuple[int, int]) -> ThreadOffsets | None:
    row = measured(version)
    return ThreadOffsets(row["tstate_interp"], row.get("tstate_native_thread_id", -1)) if row else None
