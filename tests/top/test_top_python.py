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
REFRESHES = 60  # at most: top is stopped AFTER_WALKED windows after it walks the server (25 s in all, before)
AFTER_WALKED = 2  # the second window after it is wholly after the walkers had the server


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
    """The rows of the AFTER_WALKED-th one-second window (-z) once top's CFI walker has the server's unwind
    table and its Python walker the server: the windows before may come without them (a few seconds on a
    loaded machine with a fresh cache). The windows after it are not waited for."""
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
        wanted = len(tables(lines)) + AFTER_WALKED
        while len(tables(lines)) < wanted and top.poll() is None:
            assert time.monotonic() < deadline, "top printed no window after it walked the server"
            time.sleep(0.1)
        top.send_signal(signal.SIGINT)
        assert top.wait(timeout=60) == 0, top.stderr.read()
        reader.join(timeout=10)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
    shown = tables(lines)
    assert len(shown) >= wanted, shown
    table = shown[wanted - 1]
    rows = [(float(m["percent"]), m["dso"], m["symbol"]) for m in map(ROW.match, table.splitlines()) if m]
    assert len(rows) >= ROWS // 2, table
    return rows


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
