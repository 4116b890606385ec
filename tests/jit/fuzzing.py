"""Hypothesis strategies and one-input checks for fuzzing the JIT readers and `optrace jit show/convert`
(imported by test_fuzz.py with bounded examples; `python tests/jit/fuzzing.py N` is the long run)."""
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
small = st.one_of(st.integers(0, 64), u64)  # sizes, counts, code indexes: mostly plausible
address = st.one_of(st.integers(0x1000, 0x1100), st.integers(0, 2**48), u64)  # often the same few pages


def rare(draw) -> bool:
    """True one time in eight: most examples stay well-formed enough to reach the deeper code."""
    return draw(st.integers(0, 7)) == 0


@st.composite
def raw_record(draw, order: str = "<") -> bytes:
    """A record prefix and a payload whose fixed part, strings and sizes are drawn to be wrong in all the
    ways a writer (or an attacker) can get them wrong."""
    rid = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 77]))
    fixed = {0: struct.pack(order + jd.LOAD_FIXED, *draw(st.tuples(u32, u32, u64, address, small, small))),
             1: struct.pack(order + jd.MOVE_FIXED, *draw(st.tuples(u32, u32, u64, address, address, small, small))),
             2: struct.pack(order + jd.DEBUG_FIXED, *draw(st.tuples(address, small))),
             4: struct.pack(order + jd.UNWIND_FIXED, *draw(st.tuples(u64, u64, u64)))}.get(rid, b"")
    fixed = fixed[: draw(st.integers(0, len(fixed)))] if rare(draw) else fixed
    tail = draw(st.one_of(st.binary(max_size=64), st.tuples(st.binary(max_size=20).map(lambda n: n.replace(b"\0", b"")),
                                                            st.binary(max_size=40)).map(lambda t: t[0] + b"\0" + t[1])))
    payload = fixed + tail
    size = draw(st.just(jd.PREFIX_SIZE + len(payload))) if not rare(draw) else draw(u32)
    return struct.pack(order + jd.PREFIX, rid, size, draw(u64)) + payload


@st.composite
def jitdump_bytes(draw) -> bytes:
    header = bytearray(jd.encode_header(draw(u32), draw(st.sampled_from([62, 183, 0, 65535, 65536, 2**32 - 1])), draw(u64),
                                        draw(st.sampled_from("<>"))))
    if rare(draw):
        struct.pack_into("<I", header, 8, draw(u32))  # header size
    order = "<" if header[:4] == b"DTiJ" else ">"
    body = b"".join(draw(st.lists(raw_record(order), max_size=8)))
    blob = bytes(header) + body
    return blob[: draw(st.integers(0, len(blob)))] if rare(draw) else blob


@st.composite
def well_formed_jitdump(draw) -> bytes:
    """Valid records only (loads with and without code, moves, debug info) at colliding, huge and
    edge addresses: what reaches the lifetimes, the regions and the ELF writer."""
    pages = st.sampled_from([0, 0x1000, 0x1008, 0x2000, 0x7F0000000000, 2**63, 2**64 - 0x2000])
    sizes = st.one_of(st.integers(1, 64), st.sampled_from([4096, 1 << 40, 2**63]))
    parts = [jd.encode_header(42, 62, draw(st.integers(0, 10)))]
    for ts in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["load", "load", "codeless", "move", "debug"]))
        addr, size, index = draw(pages), draw(sizes), draw(st.integers(0, 4))
        if addr + size >= 2**64:
            continue
        if kind == "move":
            parts.append(jd.encode_move(jd.CodeMove(ts, 42, 42, 0, draw(pages), addr, size, index)))
        elif kind == "debug":
            entries = (jd.DebugEntry(addr, 1, 0, "f.js"),)
            parts.append(jd.encode_debug_info(jd.DebugInfo(ts, addr, entries)))
        else:
            code = bytes([0x90]) * size if kind == "load" and size <= 64 else None
            payload = struct.pack("<IIQQQQ", 42, 42, addr, addr, size, index) + b"f\0" + (code or b"")
            parts.append(jd.encode_record(jd.CODE_LOAD, ts, payload))
    return b"".join(parts)


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


def main() -> None:
    """The long run: ``python tests/jit/fuzzing.py EXAMPLES`` -> examples, failures, slowest, per target.
    Hypothesis keeps a tree of what it generated for the length of a run (~90 KB an example here), so
    the examples are run in batches of 1,000, each with its own random seed."""
    import json
    import resource
    import sys

    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    targets = {"jitdump reader": (jitdump_bytes(), lambda b: check_reader(b, "jitdump")),
               "perf-map reader": (perf_map_bytes, lambda b: check_reader(b, "perfmap")),
               "jit show/convert (jitdump)": (jitdump_bytes(), lambda b: check_cli(b, "jit-42.dump")),
               "jit show/convert (well-formed jitdump)": (well_formed_jitdump(),
                                                          lambda b: check_cli(b, "jit-42.dump")),
               "jit show/convert (perf map)": (perf_map_bytes, lambda b: check_cli(b, "perf-42.map"))}
    for name, (strategy, check) in targets.items():
        stats: dict = {"examples": 0, "failures": 0, "max_seconds": 0.0}
        for _ in range(0, examples, 1000):
            _batch(strategy, check, min(1000, examples - stats["examples"]), stats)
        stats["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(name, json.dumps(stats), flush=True)


def _batch(strategy, check, examples: int, stats: dict) -> None:
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(blob: bytes) -> None:
        started = time.monotonic()
        stats["examples"] += 1
        try:
            check(blob)
        except Exception as exc:  # counted and shown, the run goes on
            stats["failures"] += 1
            stats.setdefault("first_failure", repr(exc)[:300])
        stats["max_seconds"] = max(stats["max_seconds"], time.monotonic() - started)

    run()


if __name__ == "__main__":
    main()
