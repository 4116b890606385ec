"""GIL waits (issue 33): with --off-cpu, a thread waiting for the GIL shows the Python function that wanted it
under the interpreter's take_gil, found by name (pyenv's builds) or, in Debian's stripped python3.11, as the
function PyEval_RestoreThread and PyEval_AcquireThread both call; `report --gil` keeps those waits only."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pythons import PROGRAMS, require
from support import run_optrace

GIL = PROGRAMS / "gil.py"


def record(tmp_path: Path, python: Path, *args: str) -> Path:
    out = tmp_path / "gil.data"
    proc = run_optrace("record", "-o", str(out), *args, "--", str(python), str(GIL), "2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def rows(data: Path, *args: str) -> dict[str, float]:
    doc = json.loads(run_optrace("report", "-i", str(data), "--format", "json", "--children", "--sort", "symbol",
                                 *args, check=True).stdout)
    return {row["symbol"]: row["children"] for row in doc["rows"]}


@pytest.mark.usefixtures("bpf_ready")
@pytest.mark.parametrize("version", ["3.11-debian", "3.12"])
def test_gil_waits_name_the_python_function_that_waited(tmp_path, version) -> None:
    """Three threads spinning in Python take turns with the GIL: their GIL waits are most of the program's
    (>= 60 %) under spin; the sleeper waits for it after each of its 200 sleeps (>= 10 %) under sleeper."""
    data = record(tmp_path, require(version), "--off-cpu")
    everything = rows(data, "--event", "off-cpu")
    waits = rows(data, "--event", "off-cpu", "--gil")
    assert everything.get("take_gil", 0) > 0.3 * sum(v for k, v in everything.items() if k == "clone3"), everything
    assert waits["take_gil"] == pytest.approx(everything["take_gil"])
    assert waits.get("spin", 0) >= 0.6 * waits["take_gil"], waits
    assert waits.get("sleeper", 0) >= 0.1 * waits["take_gil"], waits
    folded = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--gil", "--format", "folded",
                         check=True).stdout
    chains = [line.split(";") for line in folded.splitlines() if not line.startswith("#")]
    assert chains and all("take_gil" in chain for chain in chains)
    spin = [c for c in chains if any(re.match(r"spin \(", f) for f in c)]
    assert all(c.index("take_gil") > next(i for i, f in enumerate(c) if f.startswith("spin (")) for c in spin)
    header = run_optrace("report", "-i", str(data), "--event", "off-cpu", check=True).stdout
    assert "Waiting for Python's GIL (in take_gil)" in header


def test_take_gil_of_a_stripped_interpreter_is_the_function_both_callers_call() -> None:
    """Debian's python3.11 has no .symtab: take_gil is found from PyEval_RestoreThread and
    PyEval_AcquireThread's calls, its end from its FDE; pyenv's 3.12 names it in .symtab."""
    from optrace.frontend.python.gilfunction import take_gil_range
    from optrace.frontend.symbols.elffile import ElfFile

    for python in (require("3.11-debian"), require("3.12")):
        library = next(python.parent.parent.glob("lib/libpython3.12.so.1.0"), python)
        with open(library, "rb") as stream:
            found = take_gil_range(ElfFile(stream))
        assert found is not None and 200 < found[1] - found[0] < 4096, (library, found)
