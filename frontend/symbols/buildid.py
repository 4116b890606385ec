"""Read an ELF object's GNU build-id from its PT_NOTE segments.

This runs for every new mapped file (the recorder snapshots maps each second) and for each file of the
library-directory scan, so it reads only the ELF header, the program headers and the note segments
(about 20x faster than a pyelftools parse), each under a bound.
"""
from __future__ import annotations

import struct
from typing import BinaryIO

from optrace.frontend.symbols.access import ELF_POLICY, FileRef, open_ref
from optrace.frontend.symbols.elffile import ELF_MAGIC, ElfFile

PT_NOTE = 4
NT_GNU_BUILD_ID = 3
MAX_NOTE_BYTES = 1 << 16  # read of one note segment
MAX_NOTE_SEGMENTS = 16  # looked at, in order (real objects have 1-3)
MAX_BUILD_ID = 64  # bytes (GNU ld writes 20; the kernel keeps at most 20)


def read_build_id_file(path: str) -> bytes | None:
    """The build-id of the ELF file at ``path`` (opened without following symlinks; None when it is
    not ELF or has none). Raises OSError (RefusedFile included), ValueError when malformed."""
    with open_ref(FileRef(path, path), ELF_POLICY) as stream:
        return read_build_id(stream)


def read_build_id(stream: BinaryIO) -> bytes | None:
    """The build-id in ``stream``: None when it is not ELF or has none; ElfFormatError when malformed."""
    stream.seek(0)
    if stream.read(4) != ELF_MAGIC:
        return None
    elf = ElfFile(stream)
    notes = [segment for segment in elf.segments() if segment.type == PT_NOTE][:MAX_NOTE_SEGMENTS]
    for note in notes:
        build_id = _find_build_id(elf.read_at(note.offset, min(note.filesz, MAX_NOTE_BYTES)), elf.endian, note.align)
        if build_id:
            return build_id
    return None


def _find_build_id(data: bytes, end: str, align: int) -> bytes | None:
    align = 8 if align == 8 else 4
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, note_type = struct.unpack_from(end + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + _round_up(namesz, 4)
        if note_type == NT_GNU_BUILD_ID and data[name_at:name_at + namesz] == b"GNU\0":
            build_id = data[desc_at:desc_at + descsz]
            return build_id if len(build_id) == descsz and 0 < descsz <= MAX_BUILD_ID else None
        pos = desc_at + _round_up(descsz, align)
    return None


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) & ~(align - 1)
