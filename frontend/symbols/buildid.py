"""Read an ELF object's GNU build-id from its PT_NOTE segments, without pyelftools.

This runs for every new mapped file (the recorder snapshots maps each second) and for each file of the
library-directory scan, so it reads only the ELF header, the program headers and the note segments
(about 20x faster than a pyelftools parse).
"""
from __future__ import annotations

import struct
from typing import BinaryIO

PT_NOTE = 4
NT_GNU_BUILD_ID = 3
ELF_MAGIC = b"\x7fELF"
MAX_NOTE_BYTES = 1 << 16


def read_build_id_file(path: str) -> bytes | None:
    """The build-id of the ELF file at ``path`` (None when it is not ELF or has none). Raises OSError."""
    with open(path, "rb") as stream:
        return read_build_id(stream)


def is_elf_file(path: str) -> bool:
    """True when ``path`` starts with the ELF magic. Raises OSError."""
    with open(path, "rb") as stream:
        return stream.read(4) == ELF_MAGIC


def read_build_id(stream: BinaryIO) -> bytes | None:
    header = stream.read(64)
    if len(header) < 52 or header[:4] != ELF_MAGIC:
        return None
    for offset, size, align in _note_segments(stream, header):
        stream.seek(offset)
        build_id = _find_build_id(stream.read(min(size, MAX_NOTE_BYTES)), _endian(header), align)
        if build_id:
            return build_id
    return None


def _endian(header: bytes) -> str:
    return "<" if header[5] == 1 else ">"


def _note_segments(stream: BinaryIO, header: bytes) -> list[tuple[int, int, int]]:
    """(file offset, size, alignment) of each PT_NOTE program header."""
    end = _endian(header)
    is64 = header[4] == 2
    if is64:
        (phoff,) = struct.unpack_from(end + "Q", header, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", header, 54)
        layout = end + "II QQQQQQ"  # type flags offset vaddr paddr filesz memsz align
    else:
        (phoff,) = struct.unpack_from(end + "I", header, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", header, 42)
        layout = end + "IIIIIIII"  # type offset vaddr paddr filesz memsz flags align
    stream.seek(phoff)
    table = stream.read(phentsize * phnum)
    notes = []
    for index in range(len(table) // phentsize if phentsize else 0):
        fields = struct.unpack_from(layout, table, index * phentsize)
        if fields[0] != PT_NOTE:
            continue
        if is64:
            notes.append((fields[2], fields[5], fields[7]))
        else:
            notes.append((fields[1], fields[4], fields[7]))
    return notes


def _find_build_id(data: bytes, end: str, align: int) -> bytes | None:
    align = 8 if align == 8 else 4
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, note_type = struct.unpack_from(end + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + _round_up(namesz, 4)
        if note_type == NT_GNU_BUILD_ID and data[name_at:name_at + namesz] == b"GNU\0":
            return data[desc_at:desc_at + descsz]
        pos = desc_at + _round_up(descsz, align)
    return None


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) & ~(align - 1)
