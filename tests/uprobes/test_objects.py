"""`count PROG:SYMBOL` looks where the program really runs the symbol: the program, then its DT_NEEDED
libraries found like ld.so (Debian's python3.11 is statically linked: PyList_Append is in the program,
not in a libpython3.11.so it never loads), or, with -p, what the process maps; and it says which file."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from optrace.frontend.uprobes.objects import object_candidates
from optrace.frontend.uprobes.resolve import resolve_specs
from support import WORKLOADS

PYTHON = "/usr/bin/python3.11"


@pytest.fixture
def demo_on_path(tmp_path, monkeypatch):
    """`demo` as a program on PATH (a symlink, as /usr/bin programs often are)."""
    (tmp_path / "demo").symlink_to(WORKLOADS / "demo")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return tmp_path


@pytest.mark.skipif(not os.path.exists(PYTHON), reason="needs Debian's python3.11")
def test_a_program_name_is_the_program_not_a_library_of_that_name(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    resolution = resolve_specs(["python3.11:PyList_Append"])
    assert resolution.probes[0].binary == PYTHON
    assert resolution.notes == [f"python3.11:PyList_Append: python3.11 is the program {PYTHON}"]


def test_a_symbol_in_a_library_the_program_loads(demo_on_path):
    resolution = resolve_specs(["demo:lib_burn", "demo:hot_a"])
    lib, own = resolution.probes
    assert lib.binary == str(WORKLOADS / "libburn.so") and own.binary == str(WORKLOADS / "demo")
    assert resolution.notes == [
        f"demo:lib_burn: {WORKLOADS / 'libburn.so'} is a library demo loads (DT_NEEDED)",
        f"demo:hot_a: demo is the program {WORKLOADS / 'demo'}"]


def test_no_match_names_the_program_and_its_libraries(demo_on_path):
    with pytest.raises(Exception, match=r"no function 'nothing_here' in \S+/demo or the \d+ libraries it loads"):
        resolve_specs(["demo:nothing_here"])


def test_scripts_on_path_are_passed_over(tmp_path, monkeypatch):
    """A wrapper script (a pyenv shim) before the real program on PATH: the ELF program is taken."""
    shim = tmp_path / "demo"
    shim.write_text("#!/bin/sh\nexec true\n")
    shim.chmod(0o755)
    real = tmp_path / "bin"
    real.mkdir()
    (real / "demo").symlink_to(WORKLOADS / "demo")
    monkeypatch.setenv("PATH", f"{tmp_path}:{real}")
    assert object_candidates("demo")[0].path == str(WORKLOADS / "demo")


def test_with_a_pid_the_process_maps_decide():
    proc = subprocess.Popen([str(WORKLOADS / "calls"), "1", "0", "-"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while "libc.so" not in open(f"/proc/{proc.pid}/maps").read():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        [libc] = object_candidates("c", (proc.pid,))
        assert "libc.so" in libc.path and libc.why.endswith(f"as pid {proc.pid} maps it")
        program, *mapped = object_candidates("calls", (proc.pid,))
        assert program.path == str(WORKLOADS / "calls") and program.why.startswith(f"calls is the program of pid {proc.pid}")
        assert libc.path in {c.path for c in mapped}
    finally:
        proc.communicate(b"go\n", timeout=30)
