"""Hypothesis fuzzing of the perf-map and jitdump readers and of `optrace jit show/convert` on what they
read: no exception but the documented one-line errors, no hang (bounded examples here; tests/jit/fuzzing.py
runs the same checks for longer)."""
from __future__ import annotations

import os
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings, strategies as st

import optrace.jitmaps.perfmap as perfmap
from fuzzing import check_cli, check_reader, jitdump_bytes, perf_map_bytes, well_formed_jitdump

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(jitdump_bytes())
def test_jitdump_reader_only_raises_jitdump_error(blob):
    check_reader(blob, "jitdump")


@FUZZ
@given(perf_map_bytes)
def test_perf_map_reader_never_raises(blob):
    check_reader(blob, "perfmap")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jitdump_bytes())
def test_jit_show_and_convert_on_fuzzed_jitdumps(blob):
    check_cli(blob, "jit-42.dump")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(well_formed_jitdump())
def test_jit_show_and_convert_on_well_formed_jitdumps_at_hostile_addresses(blob):
    check_cli(blob, "jit-42.dump")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(perf_map_bytes)
def test_jit_show_and_convert_on_fuzzed_perf_maps(blob):
    check_cli(blob, "perf-42.map")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([b"1 1 ", b"ab", b"x", b"\n", b"10 4 x", b" \t", b"0x1f"]), max_size=30).map(b"".join),
       st.integers(0, 120), st.integers(1, 24))
def test_long_lines_across_reads_agree_with_one_read(tmp_path_factory, data, cut, chunk):
    """With a tiny line cap and chunk, reading in two steps gives the entries and counts of one read,
    whichever read sees a line grow past the cap."""
    path = tmp_path_factory.mktemp("pm") / "perf-1.map"
    with patch.object(perfmap, "MAX_LINE", 8), patch.object(perfmap, "CHUNK", chunk):
        path.write_bytes(data)
        whole, one = read_with(path, perfmap.PerfMapReader(), final=True)
        path.write_bytes(data[:cut])
        reader = perfmap.PerfMapReader()
        first, _ = read_with(path, reader)
        with open(path, "ab") as f:
            f.write(data[cut:])
        rest, _ = read_with(path, reader, final=True)
    assert first + rest == whole
    assert (reader.lines, reader.bad_lines, reader.long_lines) == (one.lines, one.bad_lines, one.long_lines)
    assert all(len(e.name) <= 8 for e in whole)


def read_with(path, reader, final=False):
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(reader.read_new(fd, final)), reader
    finally:
        os.close(fd)
