"""Where the symbols of a stripped object live: separate debug files (by build-id, by .gnu_debuglink)
and MiniDebugInfo (an xz-compressed ELF with a .symtab in the ``.gnu_debugdata`` section).

The search order follows gdb's documentation ("Separate Debug Files"), restricted for files that any
user controls: a debug link is a plain file name (no ``/``, no ``..``, no control characters), looked
up only in the debug directories (the binary's directory, its ``.debug/``, ``<root>/<binary dir>/``),
opened as a regular disk file with the CRC-32 computed on a bounded read; MiniDebugInfo is inflated to
at most the size of its binary (4 to 64 MiB).
"""
from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from optrace.fileaccess import RefusedFile, decompress_lzma, printable
from optrace.frontend.symbols.access import DEBUG_LINK_POLICY, FileRef, open_ref
from optrace.frontend.symbols.elffile import ElfFile

DEBUG_SUFFIX = ".debug"
MAX_DEBUGLINK_SECTION = 4096  # a file name (NAME_MAX 255), padding and a CRC
# MiniDebugInfo holds only a .symtab and .strtab of the functions not in .dynsym, far smaller than the
# code they name: it may inflate to the size of its binary, at least 4 MiB, at most 64 MiB (a 640 KB
# binary with 4 GiB of xz zeros costs 4 MiB, not the heap).
MIN_MINIDEBUGINFO_BYTES = 4 << 20
MAX_MINIDEBUGINFO_BYTES = 64 << 20
CRC_CHUNK = 1 << 20
MAX_SHOWN_NAME = 80  # characters of a refused debug link quoted in the warning


@dataclass(frozen=True)
class DebugLink:
    name: str
    crc: int


def build_id_debug_path(build_id: bytes, roots: Sequence[str]) -> str | None:
    """``<root>/.build-id/xx/rest.debug`` for the first root that has it (the roots are root's own
    configuration, so their symlinks may be followed; the file is still opened through fileaccess)."""
    hexid = build_id.hex()
    for root in roots:
        path = os.path.join(root, ".build-id", hexid[:2], hexid[2:] + DEBUG_SUFFIX)
        if os.path.isfile(path):
            return path
    return None


def original_path(build_id: bytes, roots: Sequence[str]) -> str | None:
    """Best guess of the binary's own path when only its debug file is found: Fedora's
    ``.build-id/xx/rest`` symlink to the binary, else ``<root>/<path>.debug`` -> ``<path>``. Only
    symlinks inside the debug roots (root's own) are resolved, never a user's path; the result is a name."""
    hexid = build_id.hex()
    for root in roots:
        link = os.path.join(root, ".build-id", hexid[:2], hexid[2:])
        if os.path.islink(link):
            return os.path.realpath(link)
        debug = os.path.realpath(link + DEBUG_SUFFIX)
        real_root = os.path.realpath(root) + os.sep
        if debug.startswith(real_root) and ".build-id" not in debug and debug.endswith(DEBUG_SUFFIX):
            return "/" + debug[len(real_root):-len(DEBUG_SUFFIX)]
    return None


def read_debuglink(elf: ElfFile) -> DebugLink | None:
    """The ``.gnu_debuglink`` section: a NUL-terminated file name, padding to 4 bytes, a CRC-32."""
    section = elf.section_by_name(".gnu_debuglink")
    if section is None:
        return None
    data = elf.section_data(section, MAX_DEBUGLINK_SECTION)
    name_end = data.find(b"\0")
    if name_end <= 0 or len(data) < name_end + 5:
        return None
    (crc,) = struct.unpack_from(elf.endian + "I", data, len(data) - 4)
    return DebugLink(data[:name_end].decode("utf-8", "replace"), crc)


def is_plain_file_name(name: str) -> bool:
    """A basename: no directory part, not "." or "..", no control (or undecodable) characters."""
    return (bool(name) and "/" not in name and name not in (".", "..") and "\ufffd" not in name
            and name.isprintable())


def debuglink_candidates(binary: FileRef, link: DebugLink, roots: Sequence[str]) -> Iterator[FileRef]:
    """The places gdb looks: the binary's dir and its ``.debug/`` subdir (only when the binary is read
    from its own path here; symlinks followed only if they were for the binary: a system or execve'd
    path, see FileRef; never for a path from the maps), then ``<root>/<dir>`` (root's own tree).
    Raises RefusedFile when the link is not a plain file name (``../../proc/kmsg``)."""
    if not is_plain_file_name(link.name):
        raise RefusedFile(binary.name, "debuglink",
                          f"its .gnu_debuglink {printable(link.name[:MAX_SHOWN_NAME])!r} is not a plain file name")
    directory = os.path.normpath(os.path.dirname(binary.name))  # no ".." climbing out of a debug root
    if binary.read_path == binary.name and binary.fd is None:
        for path in (os.path.join(directory, link.name), os.path.join(directory, ".debug", link.name)):
            yield FileRef(path, path, follow_symlinks=binary.follow_symlinks)
    for root in roots:
        path = os.path.join(root + directory, link.name)
        yield FileRef(path, path, follow_symlinks=True)


def find_debuglink_file(binary: FileRef, binary_identity: tuple[int, int], link: DebugLink,
                        roots: Sequence[str]) -> FileRef | None:
    """The first candidate whose CRC-32 matches (a stale debug file is worse than none) and that is not
    the binary itself (``binary_identity``: its device and inode). Candidates that are missing are
    skipped; one that is refused or unreadable raises (the caller's boundary warns)."""
    for candidate in debuglink_candidates(binary, link, roots):
        try:
            crc, identity = file_crc32(candidate)
        except FileNotFoundError:
            continue
        if identity != binary_identity and crc == link.crc:
            return candidate
    return None


def file_crc32(ref: FileRef) -> tuple[int, tuple[int, int]]:
    """CRC-32 of the whole file (under DEBUG_LINK_POLICY's size and time bounds), and its identity."""
    crc = 0
    with open_ref(ref, DEBUG_LINK_POLICY) as reader:
        info = os.fstat(reader.fd)
        while chunk := reader.read(CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc, (info.st_dev, info.st_ino)


def mini_debuginfo(elf: ElfFile) -> bytes | None:
    """The decompressed ELF image in ``.gnu_debugdata``, or None. Raises lzma.LZMAError when corrupt,
    BudgetExceeded past :func:`mini_debuginfo_budget` bytes (compressed or not)."""
    section = elf.section_by_name(".gnu_debugdata")
    if section is None:
        return None
    budget = mini_debuginfo_budget(elf.file_size)
    data = elf.section_data(section, budget)
    return decompress_lzma(data, budget, ".gnu_debugdata") if data else None


def mini_debuginfo_budget(file_size: int) -> int:
    return min(max(file_size, MIN_MINIDEBUGINFO_BYTES), MAX_MINIDEBUGINFO_BYTES)
