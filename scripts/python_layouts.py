"""Generate the Python walker's tables from each CPython's own headers:

- frontend/runtimes/cpython/layouts.py's MEASURED: the byte offsets of the fields the walker reads, for CPython
  3.8-3.12, measured by compiling a small C program against each interpreter's headers (internal ones
  included, with -DPy_BUILD_CORE) and printing offsetof()s;
- frontend/runtimes/cpython/debugshapes.py's SHAPES and CONSTANTS, for 3.13 and later: the members of
  ``_Py_DebugOffsets`` in order, read from the header that declares it (each member's position checked by
  offsetof() against the same header), and what the table does not say (the owner value of the frame an
  eval call starts with, the tag bits of a frame's code reference, the size of PyCompactUnicodeObject).

For 3.13+ the offsets themselves are measured too, to check what the interpreter's _Py_DebugOffsets says
(tests/python/test_debugoffsets.py compares them with a live process).

    python scripts/python_layouts.py [INCLUDE_DIR ...]

With no argument it measures every pyenv CPython 3.8-3.13 (``$(pyenv root)/versions/3.X.Y``), Debian's
/usr/include/python3.11 and the python3.14/3.15 headers of the Debian sid root ``make setup`` makes
(scripts/setup-sid-root.sh, $OPTRACE_SID_ROOT), prints each one's values, and prints the tables to paste
(one per minor version; versions of one minor must agree, or the script says so and exits 1). A new minor
(3.16) needs its headers only: the shape is read from them, no code changes.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from optrace.frontend.runtimes.cpython.layouts import COLUMNS

SID_ROOT = Path(os.environ.get("OPTRACE_SID_ROOT", "/var/cache/optrace-test/sid"))
MULTIARCH = "x86_64-linux-gnu"  # Debian keeps pyconfig.h in /usr/include/<triplet>/python3.X

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
_SELF_DESCRIBED = [  # 3.13+: the fields _Py_DebugOffsets gives, measured to check the parse (not kept in a table)
    ("interp_threads_head", "offsetof(PyInterpreterState, threads.head)"),
    ("tstate_frame", "offsetof(PyThreadState, current_frame)"),
    ("frame_previous", "offsetof(_PyInterpreterFrame, previous)"),
    ("frame_code", "offsetof(_PyInterpreterFrame, f_executable)"),
    ("frame_instr", "offsetof(_PyInterpreterFrame, instr_ptr)"),
    ("frame_entry", "offsetof(_PyInterpreterFrame, owner)"),
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
}
TABLE_MINORS = range(8, 13)  # the minors layouts.py keeps; 3.13+ describe themselves
FIRST_SELF_DESCRIBED = 13
_HEADERS_311 = ["Python.h", "internal/pycore_frame.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"]
HEADERS = {  # what declares the structures, by minor version (Python.h first); 3.13+ as 3.11's
    8: ["Python.h", "frameobject.h", "internal/pycore_pystate.h"],
    9: ["Python.h", "frameobject.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"],
    10: ["Python.h", "frameobject.h", "internal/pycore_interp.h", "internal/pycore_runtime.h"],
}
INCLUDE_NAME = re.compile(r"python3\.(\d+)$")

# _Py_DebugOffsets: in pycore_runtime.h (3.13), pycore_debug_offsets.h (3.14+)
DEBUG_OFFSETS_HEADERS = ("internal/pycore_debug_offsets.h", "internal/pycore_runtime.h")
_STRUCT = re.compile(r"typedef struct _Py_DebugOffsets \{(.*?)\n\} _Py_DebugOffsets;", re.S)
_GROUP_OPEN = re.compile(r"^struct(?: \w+)? ?\{$")
_GROUP_CLOSE = re.compile(r"^\} (\w+);$")
_MEMBER = re.compile(r"^uint64_t (\w+);$")
_TOP_LEVEL = ("cookie", "version", "free_threaded")  # the header before the groups
# The frame an eval call starts with is owned by FRAME_OWNED_BY_CSTACK (3.12, 3.13), by
# FRAME_OWNED_BY_INTERPRETER from 3.14 (whose CSTACK, 4, marks no eval call); every owner from it up marks
# one (CPython's own test: owner >= FRAME_OWNED_BY_INTERPRETER)
_FRAME_HEADERS = ("internal/pycore_interpframe_structs.h", "internal/pycore_frame.h")


def minor_of(include_dir: Path) -> int:
    match = INCLUDE_NAME.search(include_dir.name)
    if not match:
        raise SystemExit(f"{include_dir}: not a python3.X include folder")
    return int(match.group(1))


def fields(minor: int) -> list[tuple[str, str]]:
    return FIELDS.get(minor) or _COMMON_OBJECTS + _SELF_DESCRIBED


def c_program(minor: int, expressions: list[tuple[str, str]] | None = None) -> str:
    includes = "".join(f'#include "{header}"\n' for header in HEADERS.get(minor, _HEADERS_311))
    prints = "".join(f'    printf("{name}=%ld\\n", (long)({expr}));\n' for name, expr in expressions or fields(minor))
    return f"#define Py_BUILD_CORE 1\n{includes}#include <stddef.h>\n#include <stdio.h>\n" \
           f"int main(void) {{\n{prints}    return 0;\n}}\n"


def _run_c(include_dir: Path, program: str) -> dict[str, int]:
    """Compile ``program`` against the headers of ``include_dir`` and run it: its name=value lines."""
    with tempfile.TemporaryDirectory(prefix="optrace-pylayout-") as work:
        source, binary = Path(work) / "layout.c", Path(work) / "layout"
        source.write_text(program)
        subprocess.run(["cc", "-w", *_include_args(include_dir, Path(work)), "-o", str(binary), str(source)],
                       check=True, capture_output=True, text=True)
        out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split("=") for line in out.split())}


def _include_args(include_dir: Path, work: Path) -> list[str]:
    """-I flags for a header folder; a Debian folder outside /usr/include (a sid root's) has its pyconfig.h in
    ../<triplet>/python3.X, found through a link in ``work`` (its other headers are another libc's)."""
    args = ["-I", str(include_dir), "-I", str(include_dir / "internal")]
    multiarch = include_dir.parent / MULTIARCH / include_dir.name
    if include_dir.parent != Path("/usr/include") and multiarch.is_dir():
        (work / MULTIARCH).mkdir()
        (work / MULTIARCH / include_dir.name).symlink_to(multiarch)
        args += ["-I", str(work)]
    return args


def measure(include_dir: Path) -> dict[str, int]:
    """The offsets of one interpreter's headers (the folder that holds its Python.h)."""
    minor = minor_of(include_dir)
    return _run_c(include_dir, c_program(minor))


Shape = tuple[tuple[str, tuple[str, ...]], ...]


def debug_shape(include_dir: Path) -> Shape:
    """The groups of _Py_DebugOffsets and their members, in order, as the header declares them; each
    member's position checked with offsetof() (a parse that missed a member fails here)."""
    text = next(((include_dir / name).read_text() for name in DEBUG_OFFSETS_HEADERS
                 if (include_dir / name).exists() and "} _Py_DebugOffsets;" in (include_dir / name).read_text()), "")
    match = _STRUCT.search(text)
    if not match:
        raise SystemExit(f"{include_dir}: no _Py_DebugOffsets declared")
    groups: list[tuple[str, tuple[str, ...]]] = []
    members: list[str] | None = None
    for raw in match.group(1).splitlines():
        line = re.sub(r"//.*|/\*.*?\*/|_Py_NONSTRING", "", raw).strip()
        if _GROUP_OPEN.match(line):
            members = []
        elif members is not None and _MEMBER.match(line):
            members.append(_MEMBER.match(line).group(1))
        elif members is not None and _GROUP_CLOSE.match(line):
            groups.append((_GROUP_CLOSE.match(line).group(1), tuple(members)))
            members = None
        elif line and not any(name in line for name in _TOP_LEVEL):
            raise SystemExit(f"{include_dir}: _Py_DebugOffsets line not understood: {raw!r}")
    shape = tuple(groups)
    _check_positions(include_dir, shape)
    return shape


def _check_positions(include_dir: Path, shape: Shape) -> None:
    expected = {f"{group}.{member}": 24 + 8 * at for at, (group, member) in
                enumerate((group, member) for group, members in shape for member in members)}
    program = c_program(minor_of(include_dir), [(name.replace(".", "__"), f"offsetof(_Py_DebugOffsets, {name})")
                                                for name in expected] + [("total", "sizeof(_Py_DebugOffsets)")])
    program = program.replace('#include "Python.h"\n', '#include "Python.h"\n#include "internal/pycore_runtime.h"\n')
    got = _run_c(include_dir, program)
    wrong = {name: got[name.replace(".", "__")] for name, at in expected.items() if got[name.replace(".", "__")] != at}
    if wrong or got["total"] != 24 + 8 * len(expected):
        raise SystemExit(f"{include_dir}: _Py_DebugOffsets parsed wrong: {wrong or got['total']}")


def debug_constants(include_dir: Path) -> dict[str, int]:
    """What _Py_DebugOffsets does not say (debugshapes.MinorConstants), from the same headers."""
    frame_text = "".join((include_dir / name).read_text() for name in _FRAME_HEADERS if (include_dir / name).exists())
    owner = "FRAME_OWNED_BY_INTERPRETER" if "FRAME_OWNED_BY_INTERPRETER" in frame_text else "FRAME_OWNED_BY_CSTACK"
    tagged = "_PyStackRef f_executable" in frame_text
    program = c_program(minor_of(include_dir), [
        ("entry_owner", owner), ("code_tag_mask", "Py_TAG_BITS" if tagged else "0"),
        ("compact_extra", "sizeof(PyCompactUnicodeObject) - sizeof(PyASCIIObject)")])
    if tagged:
        program = program.replace('#include "Python.h"\n', '#include "Python.h"\n#include "internal/pycore_stackref.h"\n')
    return _run_c(include_dir, program)


def installed_include_dirs() -> list[Path]:
    """pyenv's CPython 3.8-3.13 include folders, Debian's python3.11 and the sid root's (those present)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = [path for path in sorted(root.glob("3.*/include/python3.*")) if INCLUDE_NAME.search(path.name)]
    found.append(Path("/usr/include/python3.11"))
    found += sorted((SID_ROOT / "usr" / "include").glob("python3.*"))
    return [path for path in found if (path / "internal").is_dir() and INCLUDE_NAME.search(path.name)
            and minor_of(path) >= min(TABLE_MINORS)]


def wrapped(items: list[str], width: int = 100, indent: str = " " * 14) -> str:
    """``items`` joined by ", " in lines of at most ``width`` characters (the first without the indent)."""
    lines: list[list[str]] = [[]]
    for item in items:
        if lines[-1] and len(", ".join([*lines[-1], item])) > width:
            lines.append([])
        lines[-1].append(item)
    return f",\n{indent}".join(", ".join(line) for line in lines)


def print_tables(table: dict[int, dict[str, int]], shapes: dict[int, Shape],
                 constants: dict[int, dict[str, int]]) -> None:
    print("MEASURED = {  # in the order of COLUMNS (None: the version has no such field)")
    for minor, values in sorted(table.items()):
        if minor in TABLE_MINORS:
            print(f"    (3, {minor}): ({wrapped([str(values.get(name)) for name in COLUMNS])}),")
    print("}\nSHAPES: dict[int, Shape] = {  # _Py_DebugOffsets' groups: (name, its members), in order")
    for minor, shape in sorted(shapes.items()):
        print(f"    {minor}: (")
        for group, members in shape:
            lines = [line.replace(", ", " ") for line in wrapped(list(members), 80, "").split(",\n")]
            text = " \"\n            \"".join(lines)
            print(f'        ("{group}", "{text}"),')
        print("    ),")
    print("}\nCONSTANTS = {")
    for minor, values in sorted(constants.items()):
        print(f"    {minor}: MinorConstants({', '.join(f'{name}={value}' for name, value in values.items())}),")
    print("}")


def main(argv: list[str]) -> int:
    dirs = [Path(arg) for arg in argv] or installed_include_dirs()
    table: dict[int, dict[str, int]] = {}
    shapes: dict[int, Shape] = {}
    constants: dict[int, dict[str, int]] = {}
    status = 0
    for include_dir in dirs:
        values, minor = measure(include_dir), minor_of(include_dir)
        found = [(table, values)]
        if minor >= FIRST_SELF_DESCRIBED:
            found += [(shapes, debug_shape(include_dir)), (constants, debug_constants(include_dir))]
        print(f"# {include_dir}: {values} {found[1:] and found[2][1]}")
        for kept, value in found:
            if kept.setdefault(minor, value) != value:
                print(f"# 3.{minor}: {include_dir} differs from the first header set of this minor", file=sys.stderr)
                status = 1
    print_tables(table, shapes, constants)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
