"""Hypothesis fuzzing of the perf-map and jitdump readers and of `optrace jit show/convert` on what they
read: no exception but the documented one-line errors, no hang (bounded examples here; tests/jit/fuzzing.py
runs the same checks for longer)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from fuzzing import check_cli, check_reader, jitdump_bytes, perf_map_bytes

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(perf_map_bytes)
def test_jit_show_and_convert_on_fuzzed_perf_maps(blob):
    check_cli(blob, "perf-42.map")
