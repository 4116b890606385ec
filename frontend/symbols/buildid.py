"""Read an ELF object's GNU build-id from its PT_NOTE segments, and the one cache of build-ids of
mapped files.

This runs for every new mapped file (the recorder snapshots maps each second) and for each file of the
library-directory scan, so it reads only the ELF header, the program headers and the note segments
(about 20x faster than a pyelftools parse), each under a bound.
"""
from __future__ import annotations

import os
import struct
from typing import BinaryIO

from optrace.fileaccess import reader_for
from optrace.frontend.symbols.access import ELF_POLICY, FileRef, open_mapped_file, open_ref
from optrace.frontend.symbols.elffile import ELF_MAGIC, ElfFile
from optrace.frontend.symbols.lru import LruCache
from optrace.procfs import MapEntry

PT_NOTE = 4
NT_GNU_BUILD_ID = 3
MAX_NOTE_BYTES = 1 << 16  # read of one note segment
MAX_NOTE_SEGMENTS = 16  # looked at, in order (real objects have 1-3)
MAX_BUILD_ID = 64  # bytes (GNU ld writes 20; the kernel keeps at most 20)

FileIdentity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


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


class BuildIdCache:
    """Build-ids of mapped files, cached by the file's identity, size and mtime, so a rebuilt binary
    that got the old one's inode is read again.

    Mapped files are read through /proc/PID/map_files: the very file the process maps, even deleted
    or in another mount namespace, never a path taken from user data (without CAP_SYS_ADMIN, the path
    inside the process's root, only if it is still the mapped inode; see
    :func:`~optrace.frontend.symbols.access.open_mapped_file`)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._cache: LruCache[FileIdentity, bytes | None] = LruCache(capacity)
        self.failures = 0

    def of_open_file(self, fd: int, name: str) -> bytes | None:
        """The build-id of the file open at ``fd`` (left open; ``name`` for messages). Raises OSError
        (RefusedFile, BudgetExceeded), ElfFormatError."""
        info = os.fstat(fd)
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if identity in self._cache:
            return self._cache.get(identity)
        with reader_for(os.dup(fd), ELF_POLICY, name) as stream:
            found = read_build_id(stream)
        self._cache.put(identity, found)
        return found

    def of_mapping(self, pid: int, entry: MapEntry) -> bytes | None:
        """The build-id of the file ``entry`` of ``pid`` maps. A file that cannot be read (refused,
        malformed) counts in ``failures`` and has none: its frames stay raw IPs."""
        try:
            fd = open_mapped_file(pid, entry, ELF_POLICY)
            if fd is None:
                return None
            try:
                return self.of_open_file(fd, entry.file_path)
            finally:
                os.close(fd)
        except Exception:  # noqa: BLE001 - the per-file boundary: a bad file only loses its build-id
            self.failures += 1
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
