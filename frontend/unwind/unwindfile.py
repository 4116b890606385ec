"""One file's unwind information (:class:`UnwindFile`) and its conversion from an ELF file.

Kept apart from the cache because the cache, the table builder's child process
(:mod:`optrace.frontend.unwind.builder`) and the stored tables (:mod:`optrace.frontend.unwind.tablestore`)
all make them; the last two carry them as :func:`encode_unwind_file`'s header and rows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import BinaryIO

from optrace.frontend.symbols.buildid import FileIdentity, read_build_id
from optrace.frontend.symbols.elffile import PT_LOAD, ElfFile, ProgramHeader
from optrace.frontend.symbols.leb128 import DwarfError
from optrace.frontend.unwind.table import EMPTY, ROW, UnwindTable, build_table
from optrace.procfs import MapEntry

MAX_LOAD_SEGMENTS = 64  # PT_LOADs kept per file (linkers write 2-5)


@dataclass(frozen=True)
class UnwindFile:
    """One file's unwind table, build-id and PT_LOAD segments."""

    table: UnwindTable
    build_id: bytes | None = None
    loads: tuple[ProgramHeader, ...] = ()
    identity: FileIdentity | None = None  # the cache's key (st_dev, st_ino, st_size, st_mtime_ns)

    def bias(self, entry: MapEntry) -> int:
        """The load bias of the mapping ``entry`` of this file: a mapped address is at the file's virtual
        address ``address - bias`` (the rows' pcs). The segment is the one the mapping's file range
        overlaps (the executable one first), so a p_offset that is not page-aligned is fine."""
        length = entry.end - entry.start
        overlapping = [seg for seg in self.loads
                       if seg.offset < entry.offset + length and entry.offset < seg.offset + max(seg.filesz, 1)]
        overlapping.sort(key=lambda seg: not seg.executable)
        delta = overlapping[0].vaddr - overlapping[0].offset if overlapping else 0
        return entry.start - entry.offset - delta

    def executable_segment(self) -> tuple[int, int, int] | None:
        """(vaddr, size in the file, vaddr - file offset) of its first executable segment, for a file known by
        identity (the walks of images find a mapping's rows and load bias by it, bpf/images.c)."""
        if self.identity is None:
            return None
        segment = next((seg for seg in self.loads if seg.executable), None)
        return None if segment is None else (segment.vaddr, segment.filesz, segment.vaddr - segment.offset)

    def file_vaddr(self, entry: MapEntry, address: int) -> int:
        """The file's virtual address of ``address`` in the mapping ``entry``."""
        return address - self.bias(entry)


def convert_file(stream: BinaryIO, identity: FileIdentity | None = None,
                 stop: Callable[[], bool] = lambda: False) -> UnwindFile:
    """The unwind table, PT_LOAD segments and build-id of the ELF file ``stream`` (see build_table for
    ``stop`` and what it raises)."""
    elf = ElfFile(stream)
    loads = tuple(seg for seg in elf.segments() if seg.type == PT_LOAD)[:MAX_LOAD_SEGMENTS]
    build_id = read_build_id(stream)  # first: the table's build may take a while, the reader has a time budget
    return UnwindFile(build_table(elf, stop=stop), build_id, loads, identity)


def file_without_rows(stream: BinaryIO, identity: FileIdentity | None = None) -> UnwindFile:
    """The PT_LOAD segments and build-id of the ELF file ``stream``, no table: its code is walked by frame
    pointers, its frames still named by file and offset."""
    elf = ElfFile(stream)
    loads = tuple(seg for seg in elf.segments() if seg.type == PT_LOAD)[:MAX_LOAD_SEGMENTS]
    return UnwindFile(EMPTY, read_build_id(stream), loads, identity)


def encode_unwind_file(unwind: UnwindFile) -> tuple[dict, bytes]:
    """A JSON-able header and the rows: what :func:`decode_unwind_file` takes back."""
    table = unwind.table
    header = {"count": table.count, "source": table.source, "unsupported": table.unsupported,
              "problems": table.problems, "problem": table.problem,
              "build_id": unwind.build_id.hex() if unwind.build_id is not None else None,
              "loads": [asdict(load) for load in unwind.loads]}
    return header, table.rows


def decode_unwind_file(header: dict, rows: bytes, identity: FileIdentity | None) -> UnwindFile:
    """Raises DwarfError when the rows are not the header's count, KeyError, TypeError or ValueError when
    the header is not one :func:`encode_unwind_file` wrote."""
    if len(rows) != header["count"] * ROW.size:
        raise DwarfError("the table builder's answer does not add up")
    table = UnwindTable(rows, header["count"], header["source"], header["unsupported"], header["problems"],
                        header["problem"])
    build_id = bytes.fromhex(header["build_id"]) if header["build_id"] is not None else None
    return UnwindFile(table, build_id, tuple(ProgramHeader(**load) for load in header["loads"]), identity)
