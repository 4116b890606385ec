"""Issue 8's table, live: 1,000,000 distinct 200-byte names in a perf map, in a recording and a serve
session of their own (reading that map is work done inside a drain)."""
from __future__ import annotations

import livetests
from livetests import *  # noqa: F401,F403 - the shared fixtures and tests, run for this GROUP

GROUP = "million"


@pytest.mark.xfail(strict=True, reason="jit: what a poll leaves of a 217 MB perf map is read whole in record's "
                   "final drain, after the process's symbol budget is already full: -d 6 ends after 9.2-9.4 s")
def test_record_completes_in_time_and_bounded(recorded):
    livetests.test_record_completes_in_time_and_bounded(recorded)
