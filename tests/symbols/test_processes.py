"""Raw-address frames resolved through /proc/PID/maps snapshots: file mappings, [vdso], JIT memory,
processes that exited or exec'd, other mount namespaces and unreadable binaries."""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from optrace.model import UNKNOWN, Frame, RawSample, UserFrame
from optrace.frontend.symbols import Symbolizer
from optrace.procfs import MapEntry, parse_maps

REPO = Path(__file__).resolve().parents[2]


def maps_of(pid: int | str) -> list[MapEntry]:
    return parse_maps(Path(f"/proc/{pid}/maps").read_text())


def frame_of(symbolizer: Symbolizer, pid: int, user: tuple[UserFrame, ...], when: float = 0.0) -> list[Frame]:
    frames, samples = symbolizer.symbolize([RawSample(pid, "t", user, (), 1, when)])
    return [frames[index] for index in samples[0].frames]


def address_in(pid: int, path: Path, file_offset: int) -> int:
    """Where ``file_offset`` of ``path`` is mapped in ``pid`` (executable mapping)."""
    for entry in maps_of(pid):
        if entry.path == str(path) and entry.executable and entry.offset <= file_offset < entry.offset + entry.end - entry.start:
            return entry.start + file_offset - entry.offset
    raise AssertionError(f"{path} offset {file_offset:#x} is not mapped in {pid}")


def vdso_symbol_value(tmp_path: Path, name: str) -> int:
    """The symbol's offset in the vDSO image, from nm on a dump of our own [vdso]."""
    (entry,) = [e for e in maps_of("self") if e.path == "[vdso]"]
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        mem.seek(entry.start)
        (tmp_path / "vdso.so").write_bytes(mem.read(entry.end - entry.start))
    output = subprocess.run(["nm", "-D", str(tmp_path / "vdso.so")], capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[0], 16) for line in output.splitlines() if line.split()[-1].split("@")[0] == name)


@pytest.fixture
def sleeper():
    process = subprocess.Popen(["sleep", "30"])
    yield process
    process.kill()
    process.wait()


def test_vdso_raw_address_of_another_process(tmp_path: Path, sleeper: subprocess.Popen, elf) -> None:
    value = vdso_symbol_value(tmp_path, "__vdso_clock_gettime")
    symbolizer = Symbolizer(debug_roots=())
    for pid in (os.getpid(), sleeper.pid):
        symbolizer.snapshot_process(pid)
        (vdso,) = [e for e in maps_of(pid) if e.path == "[vdso]"]
        (frame,) = frame_of(symbolizer, pid, (UserFrame(None, vdso.start + value + 5),))
        assert (frame.symbol, frame.dso, frame.address) == ("__vdso_clock_gettime", "[vdso]", value + 5)
    vdso_id = elf.build_id(tmp_path / "vdso.so")  # a build-id frame in the vDSO names it too
    (frame,) = frame_of(symbolizer, 1, (UserFrame(vdso_id, value),))
    assert (frame.symbol, frame.dso) == ("__vdso_clock_gettime", "[vdso]")


def test_raw_address_in_shared_library_of_live_process(workloads: Path, elf) -> None:
    library = workloads / "libburn.so"
    ctypes.CDLL(str(library))
    offset = elf.offset_of(library, "lib_burn", plus=9)
    symbolizer = Symbolizer(debug_roots=())
    symbolizer.snapshot_process(os.getpid())
    (frame,) = frame_of(symbolizer, os.getpid(), (UserFrame(None, address_in(os.getpid(), library, offset)),))
    assert frame == Frame("lib_burn", str(library), address=offset, build_id=elf.build_id(library).hex())


def test_anonymous_executable_memory_goes_to_jit_lookup() -> None:
    region = mmap.mmap(-1, 8192, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    calls = []

    def jit_lookup(pid: int, address: int, when: float):
        calls.append((pid, address, when))
        return ("LazyCompile:*fib /app.js:3", "/tmp/perf-1.map") if address == start + 16 else None

    symbolizer = Symbolizer(debug_roots=(), jit_lookup=jit_lookup)
    symbolizer.snapshot_process(os.getpid())
    pid = os.getpid()
    named, unnamed = frame_of(symbolizer, pid, (UserFrame(None, start + 16), UserFrame(None, start + 32)), 7.5)
    assert named == Frame("LazyCompile:*fib /app.js:3", "[jit] /tmp/perf-1.map", address=start + 16)
    assert unnamed == Frame(UNKNOWN, UNKNOWN, address=start + 32, resolved=False)
    assert calls == [(pid, start + 16, 7.5), (pid, start + 32, 7.5)]
    del region


def test_exited_process_symbolized_by_build_id_and_old_snapshot(workloads: Path, elf) -> None:
    demo, library = workloads / "demo", workloads / "libburn.so"
    process = subprocess.Popen([str(demo), "0.5"])
    try:
        time.sleep(0.2)
        symbolizer = Symbolizer(debug_roots=())
        symbolizer.snapshot_process(process.pid)
        symbolizer.snapshot_process(process.pid)  # unchanged maps: nothing re-read
        assert symbolizer.stats["maps_snapshots"] == 1
        lib_offset = elf.offset_of(library, "lib_burn", plus=4)
        raw_address = address_in(process.pid, library, lib_offset)
    finally:
        assert process.wait(timeout=30) == 0
    symbolizer.snapshot_process(process.pid)  # gone: keeps what it had
    frames = frame_of(symbolizer, process.pid, (
        UserFrame(elf.build_id(library), lib_offset),
        UserFrame(elf.build_id(demo), elf.offset_of(demo, "hot_a", plus=4)),
        UserFrame(None, raw_address),
    ))
    assert [(f.symbol, f.dso) for f in frames] == [
        ("lib_burn", str(library)), ("hot_a", str(demo)), ("lib_burn", str(library))]
    assert symbolizer.warnings == []


def test_mapping_from_before_an_exec_still_resolves(workloads: Path, elf) -> None:
    library = workloads / "libburn.so"
    script = (f"import ctypes, os, sys; ctypes.CDLL({str(library)!r}); print('ready', flush=True); "
              "sys.stdin.readline(); os.execv('/bin/sleep', ['sleep', '30'])")
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        symbolizer = Symbolizer(debug_roots=())
        symbolizer.snapshot_process(process.pid)
        offset = elf.offset_of(library, "lib_burn")
        address = address_in(process.pid, library, offset)
        process.stdin.write("go\n")
        process.stdin.flush()
        deadline = time.monotonic() + 10
        while "sleep" not in Path(f"/proc/{process.pid}/comm").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        symbolizer.snapshot_process(process.pid)
        assert not any(e.path == str(library) for e in maps_of(process.pid))
        (frame,) = frame_of(symbolizer, process.pid, (UserFrame(None, address),))
        assert (frame.symbol, frame.dso) == ("lib_burn", str(library))
    finally:
        process.kill()
        process.wait()


def test_unknown_pid_raw_address_is_unknown() -> None:
    symbolizer = Symbolizer(debug_roots=())
    (frame,) = frame_of(symbolizer, 999_999_999, (UserFrame(None, 0x401000),))
    assert frame == Frame(UNKNOWN, UNKNOWN, address=0x401000, resolved=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")
def test_binary_only_visible_in_another_mount_namespace(workloads: Path, elf) -> None:
    """The process runs <private tmpfs>/demo, a file that does not exist in our mount namespace; it is
    killed before symbolization, yet the snapshot kept the file open through /proc/PID/map_files."""
    demo = workloads / "demo"
    hidden = Path(tempfile.mkdtemp(prefix="optrace-ns-"))
    script = (f"mount -t tmpfs none {hidden} && cp {demo} {workloads / 'libburn.so'} {hidden}/ && "
              f"exec {hidden}/demo 30")
    process = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while "demo" not in Path(f"/proc/{process.pid}/comm").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # let the dynamic linker map libburn.so
        symbolizer = Symbolizer(debug_roots=())
        symbolizer.snapshot_process(process.pid)
    finally:
        process.kill()
        process.wait()
        hidden.rmdir()
    assert not (hidden / "demo").exists()
    ref = symbolizer.machine.by_build_id[elf.build_id(demo)]
    assert ref.name == f"{hidden}/demo" and ref.read_path is None and ref.fd is not None  # kept open, read by dup
    library = workloads / "libburn.so"
    frames = frame_of(symbolizer, process.pid, (UserFrame(elf.build_id(demo), elf.offset_of(demo, "hot_b")),
                                                UserFrame(elf.build_id(library), elf.offset_of(library, "lib_burn"))))
    assert [(f.symbol, f.dso) for f in frames] == [("hot_b", f"{hidden}/demo"), ("lib_burn", f"{hidden}/libburn.so")]
    assert symbolizer.warnings == []
    symbolizer.close()


NOBODY_SCRIPT = """
import json, os, sys
from optrace.model import RawSample, UserFrame
from optrace.frontend.symbols import Symbolizer
path, build_id, offset = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
symbolizer = Symbolizer(debug_roots=())
symbolizer.add_executable(path)
os.chmod(path, 0)
symbolizer.add_executable(path + ".missing")
frames, _ = symbolizer.symbolize([RawSample(1, "t", (UserFrame(build_id, offset),), (), 1)])
print(json.dumps({"frame": [frames[0].symbol, frames[0].dso, frames[0].resolved], "warnings": symbolizer.warnings}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to user nobody needs root")
def test_unreadable_binary_is_a_warning_not_an_exception(program: Path, elf) -> None:
    offset = elf.offset_of(program, "alpha")
    shared = Path(tempfile.mkdtemp(prefix="optrace-nobody-"))
    try:
        shared.chmod(0o755)
        copy = shared / "prog"
        shutil.copy(program, copy)
        os.chown(copy, 65534, 65534)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", NOBODY_SCRIPT,
             str(copy), elf.build_id(program).hex(), str(offset)],
            capture_output=True, text=True, timeout=60, cwd="/")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["frame"] == [f"prog+{offset:#x}", str(copy), False]
        assert f"cannot read {copy}: Permission denied; its frames show as prog+0xOFFSET" in report["warnings"]
        assert any("prog.missing" in line and "No such file" in line for line in report["warnings"])
    finally:
        shutil.rmtree(shared)


def test_an_interpreters_frames_are_marked_once_told() -> None:
    """Frame.interpreter: the file frontend/runtimes/cpython found a process's interpreter in (here this test's own
    python3.11) marks its frames, by the process's mapped file and by build-id (a process gone), also a frame
    named before it was told (the frame cache holds it)."""
    from optrace.frontend.symbols.buildid import read_build_id

    executable = Path(os.path.realpath(sys.executable))
    entry = next(e for e in maps_of("self") if e.path == str(executable) and e.executable)
    with open(executable, "rb") as f:
        build_id = read_build_id(f)
    frame = UserFrame(build_id, entry.offset + 0x40)
    libc = next(e for e in maps_of("self") if "libc.so" in e.path and e.executable)
    with open(libc.path, "rb") as f:
        other = UserFrame(read_build_id(f), libc.offset + 0x40)
    symbolizer = Symbolizer()
    symbolizer.snapshot_process(os.getpid())
    assert [f.interpreter for f in frame_of(symbolizer, os.getpid(), (frame, other))] == [False, False]
    symbolizer.add_interpreter(build_id, entry.file_key)
    assert [f.interpreter for f in frame_of(symbolizer, os.getpid(), (frame, other))] == [True, False]
    gone = Symbolizer()  # a process that exited: named by build-id
    gone.add_interpreter(build_id, ("0:0", 0))
    assert [f.interpreter for f in frame_of(gone, 999_999_999, (frame, other))] == [True, False]
