"""_Py_DebugOffsets (3.13+): the real interpreters' (pyenv's 3.13.0, Debian sid's 3.14 and 3.15), read from
live processes and compared with offsetof()s of their own headers; the shapes and constants kept in
debugshapes.py generated again from those headers; tables synthesized at the byte positions of the v3.14.0
header (760 bytes); newer minors read with the known shapes; corrupted tables refused with a reason."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from optrace.frontend.runtimes.cpython import debugoffsets
from optrace.frontend.runtimes.cpython.debugoffsets import READ_SIZE, parse_debug_offsets
from optrace.frontend.runtimes.cpython.debugshapes import CONSTANTS, SHAPES
from optrace.frontend.runtimes.cpython.interpreter import python_mappings
from optrace.frontend.runtimes.cpython.interpreterfile import interpreter_file
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.procfs import read_maps
from optrace.pythonlayout import ENTRY_SHIM, INSTR_POINTER, LINES_LOCATIONS, MAX_OFFSET
from pythons import POSITIONS_313, child, command, include_dir, minor_name, synthesized
from test_layouts import generator, measured

SELF_DESCRIBED = ["3.13", "3.14-sid", "3.15-sid"]


def live_runtime_bytes(pid: int) -> bytes:
    maps = [entry for entry in read_maps(pid).entries if entry.executable]
    for entry, _named in python_mappings(maps):
        facts = interpreter_file(pid, entry)
        if not isinstance(facts, str) and facts.runtime:
            return ProcessMemory(pid).read(facts.runtime + facts.bias(entry), READ_SIZE)
    raise AssertionError("no _PyRuntime mapped")


def minor_of(name: str) -> int:
    return int(minor_name(name).split(".")[1])


@pytest.mark.parametrize("name", SELF_DESCRIBED)
def test_live_table_matches_its_headers(name):
    headers = measured(name)
    constants = generator().debug_constants(include_dir(name))
    with child([*command(name), "-c", "import sys, time; print(sys.version.split()[0], flush=True); time.sleep(60)"],
               lines=1) as (proc, (said,)):
        data = live_runtime_bytes(proc.pid)
    parsed = parse_debug_offsets(data, (3, minor_of(name)))
    assert not isinstance(parsed, str), parsed
    assert ".".join(map(str, parsed.version)) == said
    layout = parsed.layout
    assert layout.interp_threads_head > 4096  # why the walker's offsets are u16s
    for field in ("interpreters_head", "interp_threads_head", "tstate_next", "tstate_thread_id", "tstate_frame",
                  "frame_previous", "frame_code", "frame_instr", "frame_entry", "code_adaptive",
                  "code_name", "code_qualname", "code_filename", "code_linetable", "code_firstlineno",
                  "unicode_length", "unicode_state", "unicode_ascii_data", "unicode_compact_data", "bytes_size",
                  "bytes_data"):
        assert getattr(layout, field) == headers[field], field
    assert parsed.threads.tstate_interp == headers["tstate_interp"]
    assert parsed.threads.tstate_native_thread_id == headers["tstate_native_thread_id"]
    assert (layout.entry_value, layout.code_tag_mask) == (constants["entry_owner"], constants["code_tag_mask"])
    assert (layout.entry_kind, layout.instr_kind, layout.linetable_kind) == (ENTRY_SHIM, INSTR_POINTER, LINES_LOCATIONS)
    assert layout.cframe_current_frame == -1


@pytest.mark.parametrize("name", SELF_DESCRIBED)
def test_shapes_and_constants_are_the_headers(name):
    """debugshapes.py is what scripts/python_layouts.py reads from the headers (each member's position
    checked by offsetof() there)."""
    folder = include_dir(name)
    if folder is None:
        pytest.skip(f"no headers of python {name}")
    minor = minor_of(name)
    assert generator().debug_shape(folder) == SHAPES[minor]
    assert generator().debug_constants(folder) == CONSTANTS[minor].__dict__


# -- synthesized tables: byte positions of the v3.14.0 and v3.13.0 headers, written out by hand ----------------
POSITIONS_314 = {  # byte offset in _Py_DebugOffsets -> value
    24: 300000, 40: 640,  # runtime_state.size, .interpreters_head
    48: 9000, 72: 3000,  # interpreter_state.size, .threads_head
    176: 500, 192: 8, 200: 16, 208: 80, 216: 160, 224: 168,  # thread_state size next interp current_frame ids
    248: 80, 256: 8, 264: 0, 272: 56, 288: 74,  # interpreter_frame size previous executable instr_ptr owner
    312: 208, 320: 112, 328: 120, 336: 128, 344: 136, 352: 68, 384: 200,  # code_object
    400: 16, 408: 8,  # pyobject size, ob_type
    592: 40, 600: 16, 608: 32,  # bytes_object size ob_size ob_sval
    616: 56, 624: 32, 632: 16, 640: 40,  # unicode_object size state length asciiobject_size
}
def test_314_synthesized():
    parsed = parse_debug_offsets(synthesized(POSITIONS_314, 0x030E00F0, 760), (3, 14))
    assert not isinstance(parsed, str), parsed
    layout = parsed.layout
    assert parsed.version == (3, 14, 0) and layout.version == (3, 14)
    assert (layout.interpreters_head, layout.interp_threads_head, layout.tstate_next, layout.tstate_thread_id,
            layout.tstate_frame) == (640, 3000, 8, 160, 80)
    assert (layout.frame_previous, layout.frame_code, layout.frame_instr, layout.frame_entry) == (8, 0, 56, 74)
    assert (layout.code_filename, layout.code_name, layout.code_qualname, layout.code_linetable,
            layout.code_firstlineno, layout.code_adaptive) == (112, 120, 128, 136, 68, 200)
    assert (layout.bytes_size, layout.bytes_data) == (16, 32)
    assert (layout.unicode_state, layout.unicode_length, layout.unicode_ascii_data,
            layout.unicode_compact_data) == (32, 16, 40, 56)
    assert layout.entry_value == 3 and layout.code_tag_mask == 3  # FRAME_OWNED_BY_INTERPRETER, _PyStackRef tags
    assert (parsed.threads.tstate_interp, parsed.threads.tstate_native_thread_id) == (16, 168)


def test_313_synthesized():
    parsed = parse_debug_offsets(synthesized(POSITIONS_313, 0x030D05F0, 584), (3, 13))
    assert not isinstance(parsed, str), parsed
    assert parsed.version == (3, 13, 5)
    assert (parsed.layout.interp_threads_head, parsed.layout.frame_entry, parsed.layout.entry_value) == (3000, 70, 3)


def test_newer_minor_with_a_known_shape_is_read_with_it():
    """A 3.16 whose table kept 3.14's shape: 3.15's (longer) finds it truncated, 3.14's passes; the constants
    are the newest minor's."""
    parsed = parse_debug_offsets(synthesized(POSITIONS_314, 0x031000A1, 760), (3, 16))
    assert not isinstance(parsed, str), parsed
    assert parsed.layout.version == (3, 16) and parsed.layout.entry_value == CONSTANTS[max(CONSTANTS)].entry_owner
    assert (parsed.layout.tstate_thread_id, parsed.layout.frame_entry) == (160, 74)


def test_newer_minor_whose_table_grew_in_the_middle_is_refused():
    """3.15's thread_state grew by 7 members (and more groups followed): a 3.16 that grew so again shifts
    the later groups under every known shape, and the fixed facts (PyObject's size) fail."""
    shifted = {at + 56 if at >= 248 else at: value for at, value in POSITIONS_314.items()}
    reason = parse_debug_offsets(synthesized(shifted, 0x031000A1, 1200), (3, 16))
    assert isinstance(reason, str) and "refused" in reason


def test_315_read_with_314_shape_would_be_refused(monkeypatch):
    """Why 3.15 was refused before its shape was known: its table read with 3.14's shape puts PyObject's
    group on other members."""
    shifted = {at + 56 if at >= 248 else at: value for at, value in POSITIONS_314.items()}
    monkeypatch.delitem(SHAPES, 15)
    reason = parse_debug_offsets(synthesized(shifted, 0x030F02F0, 1200), (3, 15))
    assert reason == "debug offsets of 3.15 refused: PyObject is not 16 bytes with ob_type at 8"


@pytest.mark.parametrize("change, expected", [
    (dict(cookie=b"xdebugpz"), "no debug offsets cookie"),
    (dict(free_threaded=1), "free-threaded build"),
    (dict(version_hex=0x030C01F0), "debug offsets say 3.12, the file 3.14"),
    (dict(positions={**POSITIONS_314, 256: 200}), "interpreter_frame.previous = 200 out of range"),
    (dict(positions={**POSITIONS_314, 328: 300}), "code_object.name = 300 out of range"),
    (dict(positions={**POSITIONS_314, 40: 1 << 40}), "runtime_state.interpreters_head"),
    (dict(positions={**POSITIONS_314, 72: MAX_OFFSET}), "interpreter_state.threads_head"),
    (dict(positions={**POSITIONS_314, 176: 0}), "thread_state size 0 out of range"),
    (dict(positions={**POSITIONS_314, 400: 32}), "PyObject is not 16 bytes"),
    (dict(cut=700), "debug offsets truncated"),
    (dict(cut=20), "debug offsets truncated"),
])
def test_corrupted_tables_are_refused(change, expected):
    args = dict(positions=POSITIONS_314, version_hex=0x030E00F0, size=760) | change
    reason = parse_debug_offsets(synthesized(**args), (3, 14))
    assert isinstance(reason, str) and expected in reason


def test_short_input_is_refused():
    assert parse_debug_offsets(b"xdebug", None) == "debug offsets truncated"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=800), st.sampled_from([0x030D00F0, 0x030E00F0, 0x030F0000, 0x04000000]))
def test_garbage_never_raises(noise, version_hex):
    data = struct.pack("<8sQQ", b"xdebugpy", version_hex, 0) + noise
    assert isinstance(parse_debug_offsets(data, None), (str, debugoffsets.DebugOffsets))
