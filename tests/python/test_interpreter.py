"""Finding the interpreter of a process (frontend/runtimes/cpython/interpreter.py): every CPython of this machine, the
versions refused, and processes that only pretend to be CPython (programs/fakepython.c)."""
from __future__ import annotations

import mmap
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from optrace.frontend.runtimes.cpython import interpreterfile
from optrace.frontend.runtimes.cpython.interpreter import CHECK_FAILED, NOT_STARTED, find_interpreter, python_mappings
from optrace.frontend.runtimes.cpython.interpreterfile import EVAL, find_symbols
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.frontend.symbols.elffile import PT_LOAD, ElfFile
from optrace.frontend.symbols.filefacts import FileFacts
from optrace.procfs import MapEntry, read_maps
from optrace.pythonlayout import PythonProcess
from pythons import REFUSED, SUPPORTED, build_fake_python, child, command, minor_name, require

SLEEPER = "import sys, time; print(sys.version.split()[0], flush=True); time.sleep(60)"
# before 3.11 the file has no Py_Version: the version is its name's; sid's are what the interpreter says (its
# micro version moves as sid does)
VERSIONS = {"3.11-debian": "3.11.2", "3.8": "3.8", "3.9": "3.9", "3.10": "3.10", "3.11": "3.11.7", "3.12": "3.12.1",
            "3.13": "3.13.0"}


def executable_maps(pid: int) -> list[MapEntry]:
    return [entry for entry in read_maps(pid).entries if entry.executable]


def eval_code_in_file(path: str, size: int) -> bytes:
    """The first bytes of the eval function as the file holds them (read independently of the product's bias)."""
    with open(path, "rb") as stream:
        elf = ElfFile(stream)
        start, _ = find_symbols(elf, ".dynsym", (EVAL,))[EVAL]
        segment = next(seg for seg in elf.segments() if seg.type == PT_LOAD and seg.holds(start))
        return elf.read_at(start - segment.vaddr + segment.offset, size)


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_cpython_is_found(name):
    with child([*command(name), "-c", SLEEPER], lines=1) as (proc, (said,)):
        found = find_interpreter(proc.pid, executable_maps(proc.pid))
        assert isinstance(found, PythonProcess), found
        assert found.version == VERSIONS.get(name, said) and found.pid == proc.pid
        assert found.layout.version == tuple(int(part) for part in minor_name(name).split("."))
        start, end = found.eval_ranges[0]
        assert 10_000 < sum(end - start for start, end in found.eval_ranges) < 1_000_000
        assert ProcessMemory(proc.pid).read(start, 64) == eval_code_in_file(found.path, 64)


@pytest.mark.parametrize("name", REFUSED)
def test_old_versions_are_refused(name):
    with child([*command(name), "-c", SLEEPER], lines=1) as (proc, _):
        assert find_interpreter(proc.pid, executable_maps(proc.pid)) == f"python {name} not supported"


def test_a_process_without_python():
    with child(["sh", "-c", "echo up; exec sleep 60"], lines=1) as (proc, _):
        assert find_interpreter(proc.pid, executable_maps(proc.pid)) == "no python file mapped"


def test_candidates_are_chosen_by_name():
    entries = [MapEntry(0x1000, 0x2000, "r-xp", 0, "08:01", 10 + index, path) for index, path in enumerate([
        "/usr/bin/python3.11", "/opt/lib/libpython3.12.so.1.0", "/x/libpython3.7m.so.1.0", "/x/python3.13t",
        "/usr/lib/libc.so.6", "/x/python3", "/x/libpython3.so", "/x/mypython3.11", "/x/python3.11-config"])]
    named = [(entry.path, version) for entry, version in python_mappings(entries)]
    assert named == [("/usr/bin/python3.11", (3, 11)), ("/opt/lib/libpython3.12.so.1.0", (3, 12)),
                     ("/x/libpython3.7m.so.1.0", (3, 7)), ("/x/python3.13t", (3, 13))]


def test_debian_python_is_found_quickly(monkeypatch):
    """The cost for each new process: the first (the file read) and the next ones (file facts cached)."""
    with child([str(require("3.11-debian")), "-c", SLEEPER], lines=1) as (proc, _):
        maps = executable_maps(proc.pid)
        monkeypatch.setattr(interpreterfile, "_files", FileFacts(interpreterfile._read_file))
        started = time.perf_counter()
        assert isinstance(find_interpreter(proc.pid, maps), PythonProcess)
        first = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(20):
            find_interpreter(proc.pid, maps)
        cached = (time.perf_counter() - started) / 20
    print(f"find_interpreter on Debian's python3.11: {first * 1e3:.2f} ms first, {cached * 1e3:.3f} ms cached")
    assert cached < 0.02 and first < 0.5


# -- processes that pretend ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    folder = tmp_path_factory.mktemp("fakepython")
    built = {"python3.11": build_fake_python(folder)}
    for name, version_hex in (("python3.7", 0x030B02F0), ("python3.13", 0x030D00F0), ("python3.12", 0x030B02F0)):
        (folder / name).mkdir()
        built[name] = build_fake_python(folder / name, name, version_hex)
    (folder / "sleep").mkdir()
    built["sleep"] = Path(shutil.copy("/bin/sleep", folder / "sleep" / "python3.11"))
    return built


@pytest.mark.parametrize("name, mode, expected", [
    ("python3.11", "garbage", CHECK_FAILED),
    ("python3.11", "zero", NOT_STARTED),
    ("python3.11", "mismatch", CHECK_FAILED),
    ("python3.7", "loop", "python 3.7 not supported"),
    ("python3.13", "garbage", "no debug offsets cookie"),
    ("python3.12", "loop", "file named python 3.12 says 3.11.2"),
])
def test_pretenders_are_refused(fakes, name, mode, expected):
    with child([str(fakes[name]), mode], lines=1) as (proc, _):
        assert find_interpreter(proc.pid, executable_maps(proc.pid)) == expected


def test_a_binary_named_python_without_runtime(fakes):
    with child(["sh", "-c", f"echo up; exec {fakes['sleep']} 60"], lines=1) as (proc, _):
        deadline = time.monotonic() + 10
        while not python_mappings(executable_maps(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the exec
        assert find_interpreter(proc.pid, executable_maps(proc.pid)) == "no _PyRuntime"


def test_a_consistent_fake_is_accepted(fakes):
    """A fake that holds together passes the check: it is the walker's bounds that keep it harmless
    (test_walker.py walks it)."""
    with child([str(fakes["python3.11"]), "loop"], lines=1) as (proc, _):
        found = find_interpreter(proc.pid, executable_maps(proc.pid))
        assert isinstance(found, PythonProcess) and found.version == "3.11.2"


def test_a_process_that_exits_meanwhile():
    proc = subprocess.Popen([str(require("3.11-debian")), "-c", "print('up', flush=True)"], stdout=subprocess.PIPE)
    proc.stdout.readline()
    time.sleep(0.1)
    maps = executable_maps(proc.pid) or []
    proc.wait()
    assert isinstance(find_interpreter(proc.pid, maps), str)


def mapped(path: Path) -> tuple[mmap.mmap, MapEntry]:
    """``path`` mapped executable into this process, and its /proc/self/maps entry."""
    with open(path, "rb") as stream:
        mapping = mmap.mmap(stream.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
    return mapping, next(entry for entry in read_maps(os.getpid()).entries if entry.file_path == str(path))


@pytest.mark.parametrize("content", [
    b"\x7fELF" + bytes(60),  # an ELF identification and nothing else
    b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 64, 0, 64, 56, 0xFFFF, 64,
                                                       0xFFFF, 0xFFFE) + bytes(4000),  # absurd header counts
    bytes(range(256)) * 64,  # not ELF at all
], ids=["identification-only", "absurd-counts", "not-elf"])
def test_malformed_files_named_like_python(tmp_path, content):
    path = tmp_path / "libpython3.11.so.1.0"
    path.write_bytes(content)
    mapping, entry = mapped(path)
    try:
        found = interpreterfile.interpreter_file(os.getpid(), entry)
    finally:
        mapping.close()
    assert isinstance(found, str) or found.runtime is None, found  # a reason, or nothing to walk


def test_a_truncated_interpreter_file(tmp_path):
    path = tmp_path / "python3.11"
    path.write_bytes(require("3.11-debian").read_bytes()[:1 << 16])
    mapping, entry = mapped(path)
    try:
        found = interpreterfile.interpreter_file(os.getpid(), entry)
    finally:
        mapping.close()
    assert isinstance(found, str) or found.runtime is None or not found.eval_ranges
