"""One pid-list option for every command: `-p 1,2` and `-p 1 -p 2` parse alike, and every command says
the same thing about a pid that does not exist or is not a number (all refused before any BPF loads)."""
from __future__ import annotations

import pytest

from support import assert_one_line_error, run_optrace


COMMANDS = [
    ["record", "-o", "/dev/null"],
    ["count", "c:labs"],
    ["serve", "--listen", "127.0.0.1:0"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("pids", [["-p", "1,999999999"], ["-p", "1", "-p", "999999999"], ["--pid", "1,999999999"]])
def test_every_command_takes_a_pid_list(argv, pids):
    assert_one_line_error(run_optrace(*argv, *pids), "no such process: 999999999")


@pytest.mark.parametrize("argv", [*COMMANDS, ["report", "-i", "/dev/null"]], ids=lambda a: a[0])
def test_a_bad_pid_is_one_message(argv):
    option = "--pid" if argv[0] == "report" else "-p"
    assert_one_line_error(run_optrace(*argv, option, "1,abc"), "not a process id: 'abc'")


@pytest.mark.parametrize("argv", [["record", "-o", "/dev/null", "-a", "--subprocesses"], ["top", "-n", "1", "--subprocesses"],
                                  ["serve", "--listen", "127.0.0.1:0", "--subprocesses"],
                                  ["record", "-o", "/dev/null", "--subprocesses", "--", "true"]],
                         ids=["record -a", "top", "serve", "record -- CMD"])
def test_subprocesses_goes_with_pids(argv):
    """--subprocesses names the descendants of -p's processes: alone (the whole machine, a command, whose
    children are always followed) it is one line, before any BPF loads."""
    assert_one_line_error(run_optrace(*argv), "--subprocesses goes with -p PID")
