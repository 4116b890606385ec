"""Issue 8's table, live: 1,000,000 distinct 200-byte names in a perf map, in a recording and a serve
session of their own (reading that map is work done inside a drain)."""
from __future__ import annotations

from livetests import *  # noqa: F401,F403 - the shared fixtures and tests, run for this GROUP

GROUP = "million"
