"""`optrace top -p` on a Flask server (issue 41: 10 of its 12 rows were the interpreter's own code, named
``python3.11+0x...`` in Debian's stripped python3.11): its rows are the Python functions that ran and the
native code they called (the json module's C part), and the interpreter's code again with --python-internals."""
from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import IO

import pytest

from support import OPTRACE, REPO, bpf_map_keys, first_in_line, python_walker_pids

pytestmark = pytest.mark.usefixtures("bpf_ready")
FLASK_APP = REPO / "tests" / "python" / "programs" / "flaskapp.py"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"  # Debian's python3.11 with the test dependencies (Flask)
ROW = re.compile(r"^\s+(?P<percent>\d+\.\d\d)%\s+\d+\s+(?P<dso>\S+)\s+\[[.k]\] (?P<symbol>.+)$")
ROWS = 12
REFRESHES = 60  # at most: top is stopped at its first steady window after it walks the server (main: always 25)
AFTER_WALKED = 3  # windows after the walkers have the server: the first ones may still hold stacks cut short
STEADY = 99  # and then the first window whose header says this percent of its stacks have more than one frame
DEEP = re.compile(r"stacks >1 frame: (\d+)%")


@pytest.fixture
def flask_server() -> Iterator[subprocess.Popen]:
    server = subprocess.Popen([str(VENV_PYTHON), str(FLASK_APP), "180"], stdout=subprocess.PIPE, text=True,
                              preexec_fn=first_in_line)  # and its clients: ahead of the machine's other work
    try:
        assert server.stdout.readline().strip().isdigit()  # serving, its client started
        yield server
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


def last_rows(pid: int, *args: str) -> list[tuple[float, str, str]]:
    """The rows of a one-second window (-z) of top's once it is steady: AFTER_WALKED windows or more after its
    CFI walker has the server's unwind table and its Python walker the server, the first whose stacks are
    whole (STEADY); else its last window. The windows before may come without the tables and Python frames
    (a few seconds on a loaded machine with a fresh cache). The windows after it are not waited for."""
    top = subprocess.Popen([str(OPTRACE), "top", "-p", str(pid), "-F", "999", "-z", "--stdio", "-n", str(REFRESHES),
                            "-d", "1", "--rows", str(ROWS), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    lines: list[str] = []
    reader = threading.Thread(target=read_lines, args=(top.stdout, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while pid not in bpf_map_keys(top.pid, "unwind_procs") or pid not in python_walker_pids(top.pid):
            assert top.poll() is None and time.monotonic() < deadline, f"top never walked the server: {top.stderr.read()}"
            time.sleep(0.25)
        first = len(tables(lines)) + AFTER_WALKED - 1
        while steady(tables(lines), first) is None and top.poll() is None:
            assert time.monotonic() < deadline, "top printed no steady window after it walked the server"
            time.sleep(0.1)
        if top.poll() is None:
            top.send_signal(signal.SIGINT)
        assert top.wait(timeout=60) == 0, top.stderr.read()
        reader.join(timeout=10)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
    shown = tables(lines)
    chosen = steady(shown, first)
    table = shown[-1 if chosen is None else chosen]
    rows = [(float(m["percent"]), m["dso"], m["symbol"]) for m in map(ROW.match, table.splitlines()) if m]
    assert len(rows) >= ROWS // 2, table
    return rows


def steady(shown: list[str], first: int) -> int | None:
    """The first of the windows from ``first`` on whose stacks are whole (STEADY), if any."""
    return next((i for i in range(first, len(shown)) if (m := DEEP.search(shown[i])) and int(m[1]) >= STEADY), None)


def read_lines(stream: IO[str], lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def tables(lines: list[str]) -> list[str]:
    """The windows top printed whole (each a table, then a blank line)."""
    return [part for part in "".join(list(lines)).split("\n\n")[:-1] if part.strip()]


def test_top_on_a_flask_server_shows_its_python_functions(flask_server):
    internals = last_rows(flask_server.pid, "--python-internals")
    assert sum(dso == "python3.11" for _, dso, _ in internals) >= 4, f"the interpreter had too little: {internals}"
    rows = last_rows(flask_server.pid)
    assert sum(dso == "python3.11" for _, dso, _ in rows) <= 1, rows
    assert rows[0][1] != "python3.11" and any(dso == "flaskapp.py" for _, dso, _ in rows[:3]), rows
    python = sum(percent for percent, dso, _ in rows if dso.endswith(".py"))
    assert python >= 0.5 * sum(percent for percent, _, _ in rows), rows
