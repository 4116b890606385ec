"""Issue 8's table, live: 1,000,000 distinct 200-byte names in a perf map, in a recording and a serve
session of their own (reading that map is work done inside a drain: 2 MiB of it per drain, so no drain is
held up; read whole in one drain it stalled serve 40.6 s and stretched a 6 s recording to 57.9 s)."""
from __future__ import annotations

import livetests  # noqa: F401 - the shared fixtures and tests below run for this GROUP
from livetests import *  # noqa: F401,F403

GROUP = "million"
