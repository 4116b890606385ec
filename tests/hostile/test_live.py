"""Issue 8's table, live: every row but the million names in one recording and one serve session."""
from __future__ import annotations

from livetests import *  # noqa: F401,F403 - the shared fixtures and tests, run for this GROUP

GROUP = "shared"


def test_report_table_has_no_terminal_escapes(recorded):
    """The escape row's name in the table on stdout: shown, with no raw control character."""
    table = recorded.table_run
    assert table.returncode == 0, table.describe()
    assert "hescape" in table.stdout
    assert not any(ch in table.stdout for ch in "\x1b\x07\x9b"), "raw control characters reach the terminal"
