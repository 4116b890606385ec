"""UnwindTableCache: one conversion per file per session (through two paths, two processes, a build-id),
a byte bound that evicts, a rebuilt file converted again, and bad files costing only their table."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from optrace.frontend.symbols.access import FileRef
from optrace.frontend.symbols.buildid import read_build_id_file
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.unwind.table import EMPTY, build_table
from optrace.procfs import read_maps

LIBLZMA = os.path.realpath("/lib/x86_64-linux-gnu/liblzma.so.5")  # FileRef follows no symlink
LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")


def _copy(source: str | Path, target: Path) -> Path:
    shutil.copyfile(source, target)
    return target


def test_two_paths_of_one_file_convert_once(omit_fp_binary: Path, tmp_path: Path):
    other = tmp_path / "hardlink"
    os.link(omit_fp_binary, other)
    cache = UnwindTableCache()
    first = cache.of_ref(FileRef(str(omit_fp_binary), str(omit_fp_binary)))
    second = cache.of_ref(FileRef(str(other), str(other)))
    assert first.count > 10 and second is first
    assert cache.stats["conversions"] == 1 and cache.stats["hits"] == 1


def test_two_processes_convert_once(omit_fp_binary: Path):
    """The executable of two running processes, each through /proc/PID/map_files."""
    cache = UnwindTableCache()
    procs = [subprocess.Popen([str(omit_fp_binary), "1", "0", "-"], stdin=subprocess.PIPE) for _ in range(2)]
    try:
        tables = []
        for proc in procs:
            entry = _wait_for_mapping(proc.pid, str(omit_fp_binary))
            tables.append(cache.of_mapping(proc.pid, entry))
    finally:
        for proc in procs:
            proc.communicate(b"\n", timeout=10)
    assert tables[0].count > 10 and tables[1] is tables[0]
    assert tables[0].rows == build_table(omit_fp_binary.read_bytes()).rows
    assert cache.stats["conversions"] == 1


def _wait_for_mapping(pid: int, path: str):
    for _ in range(200):
        for entry in read_maps(pid).entries:
            if entry.path == path and entry.executable:
                return entry
        threading.Event().wait(0.01)
    raise AssertionError(f"{path} never mapped executable in {pid}")


def test_byte_bound_evicts_least_recently_used(tmp_path: Path):
    files = [_copy(LIBLZMA, tmp_path / f"lib{n}.so") for n in range(3)]
    one = build_table(files[0].read_bytes()).nbytes
    cache = UnwindTableCache(max_bytes=2 * one + one // 2)
    for path in files:
        cache.of_ref(FileRef(str(path), str(path)))
    assert len(cache) == 2 and cache.held_bytes == 2 * one and cache.stats["evictions"] == 1
    cache.of_ref(FileRef(str(files[0]), str(files[0])))  # evicted: converted again, evicting lib1
    assert cache.stats["conversions"] == 4 and cache.held_bytes <= cache.max_bytes
    cache.of_ref(FileRef(str(files[2]), str(files[2])))
    assert cache.stats["conversions"] == 4 and cache.stats["hits"] == 1


def test_table_larger_than_the_budget_is_returned_not_kept(tmp_path: Path):
    cache = UnwindTableCache(max_bytes=1000)
    table = cache.of_ref(FileRef(LIBLZMA, LIBLZMA))
    assert table.count > 1000 // 16 and len(cache) == 0 and cache.held_bytes == 0


def test_changed_file_is_converted_again(tmp_path: Path):
    path = _copy(LIBLZMA, tmp_path / "liblzma.so")
    cache = UnwindTableCache()
    ref = FileRef(str(path), str(path))
    cache.of_ref(ref)
    cache.of_ref(ref)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    cache.of_ref(ref)
    assert cache.stats["conversions"] == 2 and cache.stats["hits"] == 1


def test_a_forged_build_id_gets_its_own_table(tmp_path: Path):
    """A copy of liblzma with other CFI but the same build-id: the build-id is the owner's claim, so it
    is kept with each table but never shares one."""
    forged = tmp_path / "liblzma-forged.so"
    data = bytearray(Path(LIBLZMA).read_bytes())
    section = _eh_frame(bytes(data))
    data[section.offset + 0x30:section.offset + 0x40] = b"\0" * 16  # CIE/FDE bytes of the first entries
    forged.write_bytes(bytes(data))
    cache = UnwindTableCache()
    real = cache.file_of_ref(FileRef(LIBLZMA, LIBLZMA))
    fake = cache.file_of_ref(FileRef(str(forged), str(forged)))
    assert real.build_id == fake.build_id is not None
    assert real.table.rows != fake.table.rows and cache.stats["conversions"] == 2


def _eh_frame(data: bytes):
    return ElfFile(io.BytesIO(data)).section_by_name(".eh_frame")


def test_threads_asking_at_once_wait_for_one_conversion():
    cache = UnwindTableCache()
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.of_ref(FileRef(LIBC, LIBC)))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(table is results[0] for table in results)
    assert cache.stats["conversions"] == 1


@pytest.mark.parametrize("content", [b"", b"not an ELF file at all", b"\x7fELF\x02\x01\x01" + b"\0" * 9])
def test_bad_file_costs_its_table_only(tmp_path: Path, content: bytes):
    path = tmp_path / "bad.so"
    path.write_bytes(content)
    lines = []
    cache = UnwindTableCache(warn=lines.append)
    assert cache.of_ref(FileRef(str(path), str(path))) is EMPTY
    assert cache.of_ref(FileRef(str(path), str(path))) is EMPTY  # not read again
    assert cache.stats["bad_files"] == 1 and cache.stats["conversions"] == 1
    assert len(lines) == 1 and "bad.so" in lines[0]


def test_symlink_is_refused(tmp_path: Path):
    link = tmp_path / "libc-link.so"
    link.symlink_to(LIBC)
    lines = []
    cache = UnwindTableCache(warn=lines.append)
    assert cache.of_ref(FileRef(str(link), str(link))) is EMPTY
    assert cache.stats["bad_files_refused"] == 1 and "symbolic link" in lines[0]


def test_binary_without_cfi_gets_its_debug_files_debug_frame(debug_frame_binary: Path, tmp_path: Path):
    """CFI stripped from the binary; its separate debug file under <root>/.build-id/xx/rest.debug has
    the .debug_frame (as Debian's -dbg packages install them)."""
    stripped = tmp_path / "calls-stripped"
    subprocess.run(["objcopy", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr",
                    "--remove-section=.debug_frame", str(debug_frame_binary), str(stripped)], check=True)
    build_id = read_build_id_file(str(stripped))
    debug_file = tmp_path / "debug" / ".build-id" / build_id.hex()[:2] / (build_id.hex()[2:] + ".debug")
    debug_file.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(debug_frame_binary), str(debug_file)], check=True)
    assert build_table(stripped.read_bytes()) is EMPTY
    cache = UnwindTableCache(debug_roots=[str(tmp_path / "debug")])
    unwind = cache.file_of_ref(FileRef(str(stripped), str(stripped)))
    assert unwind.table.source == ".debug_frame" and cache.stats["debug_files"] == 1
    assert unwind.table.rows == build_table(debug_file.read_bytes()).rows
    assert UnwindTableCache(debug_roots=[str(tmp_path / "nowhere")]).of_ref(FileRef(str(stripped), str(stripped))) is EMPTY


def test_unwind_file_carries_identity_build_id_and_loads(omit_fp_binary: Path):
    cache = UnwindTableCache()
    unwind = cache.file_of_ref(FileRef(str(omit_fp_binary), str(omit_fp_binary)))
    info = omit_fp_binary.stat()
    assert unwind.identity == (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    assert unwind.build_id == read_build_id_file(str(omit_fp_binary)) and any(seg.executable for seg in unwind.loads)


def test_released_rows_are_converted_again_only_when_needed(omit_fp_binary: Path):
    """serve drops a file's rows once the kernel holds them, keeping what maps it; a lookup whose caller
    says the kernel lost them (a new generation) converts the file again."""
    cache = UnwindTableCache()
    proc = subprocess.Popen([str(omit_fp_binary), "1", "0", "-"], stdin=subprocess.PIPE)
    try:
        entry = _wait_for_mapping(proc.pid, str(omit_fp_binary))
        first = cache.file_of_mapping(proc.pid, entry)
        assert cache.held_bytes == first.table.nbytes > 0
        assert cache.release_rows([first.identity, ("not", "known")]) == first.table.nbytes
        assert cache.held_bytes == 0 and cache.release_rows([first.identity]) == 0
        light = cache.file_of_mapping(proc.pid, entry, need_rows=lambda identity: False)
        assert light.table.count == 0 and light.bias(entry) == first.bias(entry)
        assert (light.build_id, light.loads, light.identity) == (first.build_id, first.loads, first.identity)
        assert cache.stats["conversions"] == 1
        again = cache.file_of_mapping(proc.pid, entry)  # rows needed: the kernel lost them
        assert again.table.rows == first.table.rows and cache.stats["conversions"] == 2
        assert cache.held_bytes == first.table.nbytes
    finally:
        proc.communicate(b"\n", timeout=10)
