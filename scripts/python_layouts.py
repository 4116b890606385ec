"""Generate frontend/python/layouts.py's table: the byte offsets of the fields optrace's Python walker reads,
for CPython 3.8-3.12 (and 3.13's, to check what its _Py_DebugOffsets says), measured by compiling a small C
program against each interpreter's own headers (internal ones included, with -DPy_BUILD_CORE) and printing
offsetof()s.

    python scripts/python_layouts.py [INCLUDE_DIR ...]

With no argument it measures every pyenv CPython 3.8-3.13 (``$(pyenv root)/versions/3.X.Y``) and Debian's
/usr/include/python3.11, prints each one's values, and prints the table to paste into layouts.py (one
per minor version; versions of one minor must agree, or the script says so and exits 1). A test
(tests/python/test_layouts.py) runs :func:`measure` where the headers exist and compares with the table.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from optrace.frontend.python.layouts import COLUMNS

# (field of PythonLayout, C expression) by minor version; the constants (kinds, entry values) are the table's.
_COMMON_OBJECTS = [
    ("unicode_length", "offsetof(PyASCIIObject, length)"),
    ("unicode_state", "offsetof(PyASCIIObject, state)"),
    ("unicode_ascii_data", "sizeof(PyASCIIObject)"),
    ("unicode_compact_data", "sizeof(PyCompactUnicodeObject)"),
    ("bytes_size", "offsetof(PyBytesObject, ob_base.ob_size)"),
    ("bytes_data", "offsetof(PyBytesObject, ob_sval)"),
    ("code_name", "offsetof(PyCodeObject, co_name)"),
    ("code_filename", "offsetof(PyCodeObject, co_filename)"),
    ("code_firstlineno", "offsetof(PyCodeObject, co_firstlineno)"),
    ("interpreters_head", "offsetof(_PyRuntimeState, interpreters.head)"),
    ("tstate_next", "offsetof(PyThreadState, next)"),
    ("tstate_thread_id", "offsetof(PyThreadState, thread_id)"),
    ("tstate_interp", "offsetof(PyThreadState, interp)"),
]
_FRAME_OBJECT = [  # 3.8-3.10: PyFrameObject on the heap, one per eval call
    ("interp_threads_head", "offsetof(PyInterpreterState, tstate_head)"),
    ("tstate_frame", "offsetof(PyThreadState, frame)"),
    ("frame_previous", "offsetof(PyFrameObject, f_back)"),
    ("frame_code", "offsetof(PyFrameObject, f_code)"),
    ("frame_instr", "offsetof(PyFrameObject, f_lasti)"),
    ("code_qualname", "offsetof(PyCodeObject, co_name)"),
]
_INTERPRETER_FRAME = [  # 3.11, 3.12: _PyInterpreterFrame reached through the _PyCFrame
    ("interp_threads_head", "offsetof(PyInterpreterState, threads.head)"),
    ("tstate_frame", "offsetof(PyThreadState, cframe)"),
    ("cframe_current_frame", "offsetof(_PyCFrame, current_frame)"),
    ("frame_previous", "offsetof(_PyInterpreterFrame, previous)"),
    ("frame_code", "offsetof(_PyInterpreterFrame, f_code)"),
    ("frame_instr", "offsetof(_PyInterpreterFrame, prev_instr)"),
    ("code_qualname", "offsetof(PyCodeObject, co_qualname)"),
    ("code_linetable", "offsetof(PyCodeObject, co_linetable)"),
    ("code_adaptive", "offsetof(PyCodeObject, co_code_adaptive)"),
    ("tstate_native_thread_id", "offsetof(PyThreadState, native_thread_id)"),
]
_SELF_DESCRIBED = [  # 3.13: the fields its _Py_DebugOffsets gives, measured to check the parse (not kept in the table)
    ("interp_threads_head", "offsetof(PyInterpreterState, threads.head)"),
    ("tstate_frame", "offsetof(PyThreadState, current_frame)"),
    ("frame_previous", "offsetof(_PyInterpreterFrame, previous)"),
    ("frame_code", "offsetof(_PyInterpreterFrame, f_executable)"),
    ("frame_instr", "offsetof(_PyInterpreterFrame, instr_ptr)"),
    ("frame_entry", "offsetof(_PyInterpreterFrame, owner)"),
    ("entry_value", "FRAME_OWNED_BY_CSTACK"),
    ("code_qualname", "offsetof(PyCodeObject, co_qualname)"),
    ("code_linetable", "offsetof(PyCodeObject, co_linetable)"),
    ("code_adaptive", "offsetof(PyCodeObject, co_code_adaptive)"),
    ("tstate_native_thread_id", "offsetof(PyThreadState, native_thread_id)"),
]
FIELDS: dict[int, list[tuple[str, str]]] = {
    8: _COMMON_OBJECTS + _FRAME_OBJECT + [("code_linetable", "offsetof(PyCodeObject, co_lnotab)")],
    9: _COMMON_OBJECTS + _FRAME_OBJECT + [("code_linetable", "offsetof(PyCodeObject, co_lnotab)")],
    10: _COMMON_OBJECTS + _FRAME_OBJECT + [("code_linetable", "offsetof(PyCodeObject, co_linetable)")],
    11: _COMMON_OBJECTS + _INTERPRETER_FRAME + [("frame_entry", "offsetof(_PyInterpreterFrame, is_entry)")],
    12: _COMMON_OBJECTS + _INTERPRETER_FRAME + [("frame_entry", "offsetof(_PyInterpreterFrame, owner)"),
                                                ("entry_value", "FRAME_OWNED_BY_CSTACK")],
    13: _COMMON_OBJECTS + _SELF_DESCRIBED,
}
TABLE_MINORS = range(8, 13)  # the minors layouts.py keeps; 3.13+ describe themselves
HEADERS = {  # what declares the structures, by minor version (Python.h first)
    8: ["Python.h", "frameobject.h", "internal/pycore_pystate.h"],
    9: ["Python.h", "frameobject.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"],
    10: ["Python.h", "frameobject.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"],
    11: ["Python.h", "internal/pycore_frame.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"],
    12: ["Python.h", "internal/pycore_frame.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"],
    13: ["Python.h", "internal/pycore_frame.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"],
}
INCLUDE_NAME = re.compile(r"python3\.(\d+)$")


def minor_of(include_dir: Path) -> int:
    match = INCLUDE_NAME.search(include_dir.name)
    if not match:
        raise SystemExit(f"{include_dir}: not a python3.X include folder")
    return int(match.group(1))


def c_program(minor: int) -> str:
    includes = "".join(f'#include "{header}"\n' for header in HEADERS[minor])
    prints = "".join(f'    printf("{name}=%ld\\n", (long)({expr}));\n' for name, expr in FIELDS[minor])
    return f"#define Py_BUILD_CORE 1\n{includes}#include <stddef.h>\n#include <stdio.h>\n" \
           f"int main(void) {{\n{prints}    return 0;\n}}\n"


def measure(include_dir: Path) -> dict[str, int]:
    """The offsets of one interpreter's headers (the folder that holds its Python.h)."""
    minor = minor_of(include_dir)
    with tempfile.TemporaryDirectory(prefix="optrace-pylayout-") as work:
        source, binary = Path(work) / "layout.c", Path(work) / "layout"
        source.write_text(c_program(minor))
        subprocess.run(["cc", "-w", "-I", str(include_dir), "-I", str(include_dir / "internal"), "-o", str(binary),
                        str(source)], check=True, capture_output=True, text=True)
        out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split("=") for line in out.split())}


def installed_include_dirs() -> list[Path]:
    """pyenv's CPython 3.8-3.13 include folders and Debian's python3.11 (those present)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = [path for path in sorted(root.glob("3.*/include/python3.*")) if INCLUDE_NAME.search(path.name)]
    found.append(Path("/usr/include/python3.11"))
    return [path for path in found if (path / "internal").is_dir() and minor_of(path) in FIELDS]


def wrapped(items: list[str], width: int = 100, indent: str = " " * 14) -> str:
    """``items`` joined by ", " in lines of at most ``width`` characters (the first without the indent)."""
    lines: list[list[str]] = [[]]
    for item in items:
        if lines[-1] and len(", ".join([*lines[-1], item])) > width:
            lines.append([])
        lines[-1].append(item)
    return f",\n{indent}".join(", ".join(line) for line in lines)


def main(argv: list[str]) -> int:
    dirs = [Path(arg) for arg in argv] or installed_include_dirs()
    table: dict[int, dict[str, int]] = {}
    status = 0
    for include_dir in dirs:
        values = measure(include_dir)
        print(f"# {include_dir}: {values}")
        minor = minor_of(include_dir)
        if table.setdefault(minor, values) != values:
            print(f"# 3.{minor}: {include_dir} differs from the first header set of this minor", file=sys.stderr)
            status = 1
    print("MEASURED = {  # in the order of COLUMNS (None: the version has no such field)")
    for minor, values in sorted(table.items()):
        if minor in TABLE_MINORS:
            print(f"    (3, {minor}): ({wrapped([str(values.get(name)) for name in COLUMNS])}),")
    print("}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
