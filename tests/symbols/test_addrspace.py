"""Raw IPs turned into (build-id, file offset) frames the way the kernel's build-id stack maps do."""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import shutil
import subprocess

import pytest
from elftools.elf.elffile import ELFFile

from optrace.model import UserFrame
from optrace.fileaccess import RefusedFile
from optrace.frontend.symbols import access, buildid
from optrace.frontend.symbols.addrspace import AddressSpace, AddressSpaces
from optrace.frontend.symbols.buildid import BuildIdCache, read_build_id_file
from optrace.procfs import read_maps

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="/proc/PID/map_files needs root")


def mapping_of(address: int):
    return next(e for e in read_maps(os.getpid()).entries if e.contains(address))


def file_offset_of_symbol(path: str, name: str) -> int:
    """The symbol's file offset from the ELF file alone: its address in the PT_LOAD that holds it."""
    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        value = elf.get_section_by_name(".dynsym").get_symbol_by_name(name)[0]["st_value"]
        load = next(s for s in elf.iter_segments("PT_LOAD") if s["p_vaddr"] <= value < s["p_vaddr"] + s["p_memsz"])
        return value - load["p_vaddr"] + load["p_offset"]


def test_libc_function_becomes_libc_build_id_and_file_offset():
    address = libc_getpid()
    path = mapping_of(address).file_path
    space = AddressSpace.read(os.getpid(), BuildIdCache())
    assert space.frame(address) == UserFrame(read_build_id_file(path), file_offset_of_symbol(path, "getpid"))


def test_anonymous_memory_and_unmapped_addresses_stay_raw():
    space = AddressSpace.read(os.getpid(), BuildIdCache())
    heap = ctypes.addressof(ctypes.create_string_buffer(64))
    assert space.frame(heap) == UserFrame(None, heap)
    assert space.frame(8) == UserFrame(None, 8)
    assert len(space) > 0


def test_gone_process_has_no_address_space():
    child = subprocess.Popen(["true"])
    child.wait()
    assert AddressSpace.read(child.pid, BuildIdCache()) is None


def libc_getpid(library: str | None = None) -> int:
    handle = ctypes.CDLL(library or ctypes.util.find_library("c"))
    return ctypes.cast(handle.getpid, ctypes.c_void_p).value


def test_rebuilt_file_is_read_again(tmp_path, monkeypatch):
    """Cached by identity, size and mtime, not by (device, inode) alone, which a new file may reuse."""
    reads = []
    monkeypatch.setattr(buildid, "read_build_id", lambda stream: reads.append(1) or b"id")
    library = tmp_path / "libcopy.so"
    shutil.copy(mapping_of(libc_getpid()).file_path, library)
    entry = mapping_of(libc_getpid(str(library)))
    build_ids = BuildIdCache()
    assert build_ids.of_mapping(os.getpid(), entry) == build_ids.of_mapping(os.getpid(), entry) == b"id"
    assert len(reads) == 1
    os.utime(library, ns=(0, 0))  # what a rebuild in place changes, at least
    assert build_ids.of_mapping(os.getpid(), entry) == b"id" and len(reads) == 2


def test_replaced_snapshot_stays_readable_until_the_drain_after_next(monkeypatch):
    """Raw stacks of the old epoch may sit in the map set the sampler writes while a drain retires it."""
    monkeypatch.setattr(AddressSpace, "read", classmethod(lambda cls, pid, build_ids: cls([])))
    spaces = AddressSpaces()
    assert spaces.learn(7, epoch=100) and spaces.has(7, 100)
    spaces.end_drain([])
    assert spaces.learn(7, epoch=200)  # drain 1: a dlopen changed the epoch
    assert not spaces.has(7, 100) and spaces.get(7, 100) is not None
    spaces.end_drain([])
    assert spaces.get(7, 100) is not None  # drain 2 read the set written during drain 1
    spaces.end_drain([9])
    assert spaces.get(7, 100) is None and spaces.get(7, 200) is not None
    spaces.end_drain([7])  # the process exited: kept one more drain
    assert spaces.get(7, 200) is not None
    spaces.end_drain([])
    assert len(spaces) == 0


def test_without_cap_sys_admin_the_path_is_used_only_if_it_is_still_the_mapped_file(monkeypatch):
    """map_files needs CAP_SYS_ADMIN; the fallback path must name the very inode the process maps."""
    def no_map_files(pid, start, end, policy, shown=None):
        raise RefusedFile(f"/proc/{pid}/map_files/{start:x}-{end:x}", "unreadable", "cannot open: Operation not permitted")

    monkeypatch.setattr(access, "open_mapped", no_map_files)
    entry = mapping_of(libc_getpid())
    assert BuildIdCache().of_mapping(os.getpid(), entry) == read_build_id_file(entry.file_path)
    replaced = dataclasses.replace(entry, inode=entry.inode + 1)  # as if another file took the path
    assert BuildIdCache().of_mapping(os.getpid(), replaced) is None
