"""Where the symbols of a stripped object live: separate debug files (by build-id, by .gnu_debuglink)
and MiniDebugInfo (an xz-compressed ELF with a .symtab in the ``.gnu_debugdata`` section).

The search order follows gdb's documentation ("Separate Debug Files").
"""
from __future__ import annotations

import lzma
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile

DEBUG_SUFFIX = ".debug"


@dataclass(frozen=True)
class DebugLink:
    name: str
    crc: int


def build_id_debug_path(build_id: bytes, roots: Sequence[str]) -> str | None:
    """``<root>/.build-id/xx/rest.debug`` for the first root that has it."""
    hexid = build_id.hex()
    for root in roots:
        path = os.path.join(root, ".build-id", hexid[:2], hexid[2:] + DEBUG_SUFFIX)
        if os.path.isfile(path):
            return path
    return None


def original_path(build_id: bytes, roots: Sequence[str]) -> str | None:
    """Best guess of the binary's own path when only its debug file is found: Fedora's
    ``.build-id/xx/rest`` symlink to the binary, else ``<root>/<path>.debug`` -> ``<path>``."""
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


def read_debuglink(elf: ELFFile) -> DebugLink | None:
    """The ``.gnu_debuglink`` section: a NUL-terminated file name, padding to 4 bytes, a CRC-32."""
    section = elf.get_section_by_name(".gnu_debuglink")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    data = section.data()
    name_end = data.find(b"\0")
    if name_end <= 0 or len(data) < 4:
        return None
    (crc,) = struct.unpack_from("<I" if elf.little_endian else ">I", data, len(data) - 4)
    return DebugLink(data[:name_end].decode("utf-8", "replace"), crc)


def debuglink_candidates(binary_path: str, link: DebugLink, roots: Sequence[str]) -> Iterator[str]:
    """The places gdb looks: the binary's dir, its ``.debug/`` subdir, then ``<root>/<dir>``."""
    directory = os.path.dirname(os.path.abspath(binary_path))
    yield os.path.join(directory, link.name)
    yield os.path.join(directory, ".debug", link.name)
    for root in roots:
        yield os.path.join(root + directory, link.name)


def find_debuglink_file(binary_path: str, link: DebugLink, roots: Sequence[str]) -> str | None:
    """The first candidate whose CRC-32 matches (a stale debug file is worse than none)."""
    own = os.path.realpath(binary_path)
    for candidate in debuglink_candidates(binary_path, link, roots):
        if os.path.isfile(candidate) and os.path.realpath(candidate) != own and file_crc32(candidate) == link.crc:
            return candidate
    return None


def file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def mini_debuginfo(elf: ELFFile) -> bytes | None:
    """The decompressed ELF image in ``.gnu_debugdata``, or None. Raises lzma.LZMAError when corrupt."""
    section = elf.get_section_by_name(".gnu_debugdata")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    return lzma.decompress(section.data())
