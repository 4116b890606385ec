"""Hypothesis strategies and one-input checks for fuzzing the JIT readers and `optrace jit show/convert`
(imported by test_fuzz.py with bounded examples, and by bench/fuzz_jit.py for the long run)."""
from __future__ import annotations

import os
import struct
import tempfile
import time

from click.testing import CliRunner
from hypothesis import strategies as st

from optrace.errors import OptraceError
from optrace.frontend.commands.jit import command as jit_command
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.perfmap import PerfMapReader

EDGE_INTS = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64 - 4096]
u32 = st.one_of(st.sampled_from([v for v in EDGE_INTS if v < 2**32]), st.integers(0, 2**32 - 1))
u64 = st.one_of(st.sampled_from(EDGE_INTS), st.integers(0, 2**64 - 1), st.integers(0, 1 << 20))


@st.composite
def raw_record(draw) -> bytes:
    """A record prefix and a payload whose fixed part, strings and sizes are drawn to be wrong in all the
    ways a writer (or an attacker) can get them wrong."""
    order = "<"
    rid = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 77]))
    fixed = {0: struct.pack(order + jd.LOAD_FIXED, *draw(st.tuples(u32, u32, u64, u64, u64, u64))),
             1: struct.pack(order + jd.MOVE_FIXED, *draw(st.tuples(u32, u32, u64, u64, u64, u64, u64))),
             2: struct.pack(order + jd.DEBUG_FIXED, *draw(st.tuples(u64, u64))),
             4: struct.pack(order + jd.UNWIND_FIXED, *draw(st.tuples(u64, u64, u64)))}.get(rid, b"")
    fixed = fixed[: draw(st.integers(0, len(fixed)))] if draw(st.booleans()) else fixed
    tail = draw(st.binary(max_size=64))
    payload = fixed + tail
    size = draw(st.one_of(st.just(jd.PREFIX_SIZE + len(payload)), u32))
    return struct.pack(order + jd.PREFIX, rid, size, draw(u64)) + payload


@st.composite
def jitdump_bytes(draw) -> bytes:
    header = bytearray(jd.encode_header(draw(u32), draw(st.sampled_from([62, 183, 0, 65535])), draw(u64)))
    if draw(st.booleans()):
        struct.pack_into("<I", header, 8, draw(u32))  # header size
    body = b"".join(draw(st.lists(raw_record(), max_size=8)))
    blob = bytes(header) + body
    return blob[: draw(st.integers(0, len(blob)))] if draw(st.booleans()) else blob


hex_field = st.one_of(st.integers(0, 2**64 + 5).map(lambda v: f"{v:x}"), st.sampled_from(["", "0x", "-1", "1_0"]))
perf_map_line = st.tuples(st.sampled_from(["", "0x", " "]), hex_field, st.sampled_from([" ", "\t", "  ", ""]),
                          hex_field, st.sampled_from([" ", "\t", ""]),
                          st.text(max_size=30), st.sampled_from(["", " " * 40, "\r"])).map("".join)
perf_map_bytes = st.lists(perf_map_line, max_size=12).map(lambda ls: "\n".join(ls).encode("utf-8", "replace"))


def check_reader(blob: bytes, kind: str) -> None:
    """Whole-file read: only JitDumpError may come out of the jitdump reader, nothing out of the perf-map
    reader."""
    with tempfile.NamedTemporaryFile() as f:
        f.write(blob)
        f.flush()
        fd = os.open(f.name, os.O_RDONLY)
        try:
            if kind == "perfmap":
                list(PerfMapReader().read_new(fd, final=True))
            else:
                try:
                    list(jd.JitDumpReader().read_new(fd, final=True))
                except jd.JitDumpError as exc:
                    assert "\n" not in str(exc)
        finally:
            os.close(fd)


def check_cli(blob: bytes, name: str, max_seconds: float = 5.0) -> float:
    """`jit show` and `jit convert` on ``blob``: success or an OptraceError (one line), nothing else,
    within ``max_seconds``. Returns the time taken."""
    runner = CliRunner()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(blob)
        for args in (["show", path], ["convert", path, "-o", os.path.join(tmp, "out.elf")]):
            result = runner.invoke(jit_command, args, standalone_mode=False, catch_exceptions=True)
            if result.exception is not None:
                assert isinstance(result.exception, OptraceError), repr(result.exception)
                assert "\n" not in str(result.exception)
    took = time.monotonic() - started
    assert took < max_seconds, f"took {took:.1f} s"
    return took
