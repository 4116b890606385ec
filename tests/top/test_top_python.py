"""`optrace top -p` on a Flask server (issue 41: 10 of its 12 rows were the interpreter's own code, named
``python3.11+0x...`` in Debian's stripped python3.11): its rows are the Python functions that ran and the
native code they called (the json module's C part), and the interpreter's code again with --python-internals."""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest

from support import REPO, first_in_line, run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")
FLASK_APP = REPO / "tests" / "python" / "programs" / "flaskapp.py"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"  # Debian's python3.11 with the test dependencies (Flask)
ROW = re.compile(r"^\s+(?P<percent>\d+\.\d\d)%\s+\d+\s+(?P<dso>\S+)\s+\[[.k]\] (?P<symbol>.+)$")
ROWS = 12
REFRESHES = 25


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
    """The rows of the last of REFRESHES one-second windows (-z): the first ones may come before the process's
    unwind table and Python frames (a few seconds on a loaded machine with a fresh cache)."""
    proc = run_optrace("top", "-p", str(pid), "-F", "999", "-z", "--stdio", "-n", str(REFRESHES), "-d", "1",
                       "--rows", str(ROWS), *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = [part for part in proc.stdout.split("\n\n") if part.strip()][-1]
    rows = [(float(m["percent"]), m["dso"], m["symbol"]) for m in map(ROW.match, table.splitlines()) if m]
    assert len(rows) >= ROWS // 2, table
    return rows


def test_top_on_a_flask_server_shows_its_python_functions(flask_server):
    internals = last_rows(flask_server.pid, "--python-internals")
    assert sum(dso == "python3.11" for _, dso, _ in internals) >= 4, f"the interpreter had too little: {internals}"
    rows = last_rows(flask_server.pid)
    assert sum(dso == "python3.11" for _, dso, _ in rows) <= 1, rows
    assert rows[0][1] != "python3.11" and any(dso == "flaskapp.py" for _, dso, _ in rows[:3]), rows
    python = sum(percent for percent, dso, _ in rows if dso.endswith(".py"))
    assert python >= 0.5 * sum(percent for percent, _, _ in rows), rows
