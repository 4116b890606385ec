"""Tables looked up the way the BPF unwinder does, from live processes: a mapped address becomes the
file's virtual address through UnwindFile.bias (mapping start/offset and the PT_LOAD's p_offset/p_vaddr),
and the row found there is the one readelf lists for that address. The bias itself is checked against
an independent source: the address the dynamic linker resolved for a libc function, and that function's
st_value in libc's .dynsym (pyelftools)."""
from __future__ import annotations

import ctypes
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from framesinterp import Expected, matches

from optrace.frontend.symbols.elffile import PT_LOAD, ProgramHeader
from optrace.frontend.unwind.cache import UnwindFile, UnwindTableCache
from optrace.frontend.unwind.table import CFA_END, EMPTY
from optrace.frontend.symbols.vdso import read_own_vdso
from optrace.procfs import MapEntry, read_maps

SAMPLES_PER_MAPPING = 400


def _mapping_of(pid: int, address: int) -> MapEntry:
    return next(entry for entry in read_maps(pid).entries if entry.contains(address))


def test_bias_gives_the_dynamic_symbols_address():
    libc = ctypes.CDLL("libc.so.6")
    cache = UnwindTableCache()
    for name in ("getpid", "qsort", "malloc"):
        address = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
        entry = _mapping_of(os.getpid(), address)
        unwind = cache.file_of_mapping(os.getpid(), entry)
        with open(entry.file_path, "rb") as stream:
            symbol = ELFFile(stream).get_section_by_name(".dynsym").get_symbol_by_name(name)[0]
        assert unwind.file_vaddr(entry, address) == symbol["st_value"], name
        assert unwind.table.find(symbol["st_value"]) is not None
    assert cache.stats["conversions"] == 1  # one libc, however many lookups


@pytest.fixture
def live_processes(omit_fp_binary: Path):
    """Debian's python3.11 running a loop, and the workload built without frame pointers."""
    procs = [subprocess.Popen(["/usr/bin/python3.11", "-c", "import sys\nwhile sys.stdin.read(1) == '': pass"],
                              stdin=subprocess.PIPE),
             subprocess.Popen([str(omit_fp_binary), "1", "0", "-"], stdin=subprocess.PIPE)]
    time.sleep(0.3)
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_rows_found_from_live_addresses_are_readelfs(live_processes):
    cache = UnwindTableCache()
    rng = random.Random(10)
    checked, files, mismatches = 0, set(), []
    expected_by_file: dict[str, Expected] = {}
    for proc in live_processes:
        for entry in read_maps(proc.pid).entries:
            if not (entry.is_file and entry.executable):
                continue
            unwind = cache.file_of_mapping(proc.pid, entry)
            if not unwind.table.count:
                continue
            if entry.file_path not in expected_by_file:
                expected_by_file[entry.file_path] = Expected(entry.file_path)
            expected = expected_by_file[entry.file_path]
            files.add(entry.file_path)
            for address in rng.sample(range(entry.start, entry.end), SAMPLES_PER_MAPPING):
                vaddr = unwind.file_vaddr(entry, address)
                want, got = expected.at(vaddr), unwind.table.find(vaddr)
                if want is None:  # outside every FDE: no rule, or CFA_END
                    ok = got is None or got.cfa_type == CFA_END
                else:
                    ok = matches(got, want, vaddr, expected.plts)
                checked += 1
                if not ok:
                    mismatches.append(f"{entry.file_path} {address:#x} -> {vaddr:#x}: readelf {want}, table {got}")
    assert not mismatches, f"{len(mismatches)} of {checked}, e.g. {mismatches[:5]}"
    assert {"/usr/bin/python3.11", os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")} <= files
    assert checked >= 5 * SAMPLES_PER_MAPPING
    assert cache.stats["conversions"] == len(files)  # libc and ld.so, mapped by both, converted once


def test_bias_when_the_text_segment_is_not_page_aligned_in_the_file():
    """lld's layout: the executable PT_LOAD at p_offset 0x1a40, p_vaddr 0x2a40; the kernel maps it from
    file offset 0x1000 (page-rounded down), so the mapping's offset is below the segment's."""
    loads = (ProgramHeader(PT_LOAD, 0, 0, 0xA40, 0xA40, 0x1000, flags=4),
             ProgramHeader(PT_LOAD, 0x1A40, 0x2A40, 0x3000, 0x3000, 0x1000, flags=5))
    unwind = UnwindFile(EMPTY, None, loads)
    entry = MapEntry(0x7F0000002000, 0x7F0000005000, "r-xp", 0x1000, "08:01", 1, "/lib/liblld.so")
    assert unwind.file_vaddr(entry, 0x7F0000002A40) == 0x2A40  # the segment's first byte
    assert unwind.file_vaddr(entry, 0x7F0000004000) == 0x4000
    text_only = UnwindFile(EMPTY, None, loads[1:])
    assert text_only.bias(entry) == unwind.bias(entry)


def test_vdso_table_and_bias(tmp_path: Path):
    """The [vdso] has its own .eh_frame: its rows are readelf's (on the image dumped from this process),
    and the bias of this process's [vdso] mapping gives __vdso_clock_gettime's st_value."""
    cache = UnwindTableCache()
    unwind = cache.vdso_file()
    assert unwind.table.count > 5 and unwind.table.source == ".eh_frame" and cache.vdso_file() is unwind
    image = tmp_path / "vdso.so"
    image.write_bytes(read_own_vdso())
    expected = Expected(str(image))
    for first, last, rule in expected.ranges:
        for pc in (first, last):
            assert matches(unwind.table.find(pc), rule, pc, expected.plts), hex(pc)
    vdso = ctypes.CDLL("linux-vdso.so.1")
    address = ctypes.cast(vdso.__vdso_clock_gettime, ctypes.c_void_p).value
    entry = _mapping_of(os.getpid(), address)
    with open(image, "rb") as stream:
        symbol = ELFFile(stream).get_section_by_name(".dynsym").get_symbol_by_name("__vdso_clock_gettime")[0]
    assert entry.path == "[vdso]" and unwind.file_vaddr(entry, address) == symbol["st_value"]
