"""GIL waits (issue 33): with --off-cpu, a thread waiting for the GIL shows the Python function that wanted it
under the interpreter's take_gil, found by name (pyenv's builds) or, in Debian's stripped python3.11 and sid's
3.14 and 3.15, from PyEval_RestoreThread and PyEval_AcquireThread's calls; `report --gil` keeps those waits
only."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from pythons import PROGRAMS, PYENV_VERSIONS, SID, command, require
from support import OPTRACE, bpf_map_keys, python_walker_pids, run_optrace

GIL = PROGRAMS / "gil.py"


def record(tmp_path: Path, version: str, *args: str) -> Path:
    """The program recorded from its exec; sid's, run in a container root, recorded with -p from when the
    walkers have it (its files' tables are built while it runs: its first waits had no table) to its end."""
    out = tmp_path / "gil.data"
    if version not in SID:
        proc = run_optrace("record", "-o", str(out), *args, "--", *command(version), str(GIL), "2", timeout=300)
        assert proc.returncode == 0, proc.stderr
        return out
    program = subprocess.Popen([*command(version), str(GIL), "2", "--wait"], stdin=subprocess.PIPE, text=True)
    try:
        recorder = subprocess.Popen([str(OPTRACE), "record", "-o", str(out), *args, "-p", str(program.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_walked(recorder, program.pid)
        program.stdin.write("go\n")
        program.stdin.flush()
        program.wait(timeout=120)
        assert recorder.wait(timeout=300) == 0, recorder.stderr.read()
    finally:
        program.kill()
        program.wait()
    return out


def wait_walked(recorder: subprocess.Popen, pid: int, timeout: float = 120) -> None:
    """Until the recorder's CFI walker has the process's tables and its Python walker the process."""
    deadline = time.monotonic() + timeout
    while pid not in bpf_map_keys(recorder.pid, "unwind_procs") or pid not in python_walker_pids(recorder.pid):
        assert recorder.poll() is None and time.monotonic() < deadline, "optrace never walked the program"
        time.sleep(0.1)


def threads_time(data: Path) -> int:
    """The off-CPU time of the program's threads (comm Thread-N), in its folded stacks."""
    folded = run_optrace("report", "-i", str(data), "--event", "off-cpu", "--format", "folded", check=True).stdout
    return sum(int(line.rpartition(" ")[2]) for line in folded.splitlines() if line.startswith("Thread-"))


def rows(data: Path, *args: str) -> dict[str, float]:
    doc = json.loads(run_optrace("report", "-i", str(data), "--format", "json", "--children", "--sort", "symbol",
                                 *args, check=True).stdout)
    return {row["symbol"]: row["children"] for row in doc["rows"]}


@pytest.mark.usefixtures("bpf_ready")
@pytest.mark.parametrize("version", ["3.11-debian", "3.12", *SID])
def test_gil_waits_name_the_python_function_that_waited(tmp_path, version) -> None:
    """Three threads spinning in Python take turns with the GIL: their GIL waits are most of the program's
    (>= 60 %) under spin; the sleeper waits for it after each of its 200 sleeps (>= 10 %) under sleeper."""
    data = record(tmp_path, version, "--off-cpu")
    everything = rows(data, "--event", "off-cpu")
    waits = rows(data, "--event", "off-cpu", "--gil")
    assert everything.get("take_gil", 0) > 0.3 * threads_time(data), everything
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


def test_take_gil_of_a_stripped_interpreter_is_found_from_its_callers() -> None:
    """Found as in a stripped file, take_gil is the function .symtab names so (or its constprop clone, 3.8's
    callers' one), for every pyenv build; and one of 200-4096 bytes in Debian's stripped 3.11, 3.14, 3.15."""
    from optrace.frontend.runtimes.cpython.gilfunction import take_gil_range, unnamed_take_gil
    from optrace.frontend.runtimes.symbolnames import find_symbols
    from optrace.frontend.symbols.elffile import ElfFile

    libraries = sorted(PYENV_VERSIONS.glob("3.*/lib/libpython3.*.so.1.0"))
    assert len(libraries) >= 6
    for library in libraries:
        with open(library, "rb") as stream:
            elf = ElfFile(stream)
            named = find_symbols(elf, ".symtab", ("take_gil", "take_gil.constprop.0"))
            found = unnamed_take_gil(elf)
        assert found in [(start, start + size) for start, size in named.values()], (library, found, named)
    for name in ("3.11-debian", *SID):
        with open(require(name), "rb") as stream:
            found = take_gil_range(ElfFile(stream))
        assert found is not None and 200 < found[1] - found[0] < 4096, (name, found)
