"""`optrace top`'s bad input: one line on stderr, nothing started."""
from __future__ import annotations

import pytest

from support import OPTRACE, assert_one_line_error, run_as_nobody, run_optrace


@pytest.mark.parametrize("args,fragment", [
    (("-d", "0"), "-d takes seconds"),
    (("-s", "bogus"), "unknown sort key"),
    (("-F", "0"), "out of range"),
    (("-p", "x"), "not a process id"),
])
def test_bad_options(args, fragment):
    assert_one_line_error(run_optrace("top", "--stdio", *args, timeout=60), fragment)


@pytest.mark.root
def test_without_privileges_says_what_to_do():
    proc = run_as_nobody(str(OPTRACE), "top", "--stdio", "-n", "1", timeout=60)
    assert_one_line_error(proc, "cannot record")
