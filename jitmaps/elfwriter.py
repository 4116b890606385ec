"""`optrace jit convert`: one ELF file per process from its JIT functions, as OProfile's opjitconv did.

Layout (ET_DYN, the dump's machine and byte order):
- one SHT_PROGBITS, SHF_ALLOC|SHF_EXECINSTR section per anonymous executable region holding JIT code, at
  the region's start address (``.jit.0x<start>``). The regions are the process's anonymous executable
  mappings when it is still running, else page-aligned runs of JIT code (a dump does not record mappings).
  The bytes are the code as it was at the end of the dump (later code overwrites earlier code at the same
  address); a region with no code bytes at all is SHT_NOBITS.
  Functions without code bytes (every perf-map function, a jitdump load written without its code) get
  SHT_NOBITS regions of their own: a section's bytes are only ever the code the input carried, so the
  output is bounded by the input (a 17-byte perf map naming a 200 MB function writes no 200 MB of zeros).
  At most :data:`MAX_SECTIONS` code sections (ELF reserves section indexes from 0xff00).
- ``.symtab``/``.strtab``: one STT_FUNC symbol per function load. Code still in place at the end keeps its
  name (STB_GLOBAL); code that later code replaced (address reuse) or that moved is a STB_LOCAL symbol named
  ``name@BORN..DIED`` (seconds since the dump's header time; ``@lineN..lineM`` for perf maps), so each
  lifetime is its own symbol.
- ``.note.gnu.build-id``: SHA-1 of the symbols and section bytes (20 bytes, NT_GNU_BUILD_ID).
"""
from __future__ import annotations

import hashlib
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from optrace.jitmaps.lifetimes import JitFunction, symbol_name
from optrace.outputfile import atomic_output

PAGE = 4096
LAST_ADDRESS = (1 << 64) - 1  # region ends are clamped here: sh_addr + sh_size must fit in 64 bits
MAX_SECTIONS = 16_000
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOTE, SHT_NOBITS = 1, 2, 3, 7, 8
SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
STB_LOCAL, STB_GLOBAL, STT_FUNC = 0, 1, 2
SHN_ABS = 0xFFF1
NT_GNU_BUILD_ID = 3
EHDR = "16sHHIQQQIHHHHHH"
SHDR = "IIQQQQIIQQ"
SYM = "IBBHQQ"


@dataclass(frozen=True)
class ElfSummary:
    path: str
    sections: list[tuple[str, int, int]]  # (name, address, size)
    symbols: int
    build_id: str


class ElfLimitError(Exception):
    """The functions would need more code sections than an ELF file can index."""


def page_regions(functions: Iterable[JitFunction]) -> list[tuple[int, int]]:
    """Page-aligned runs of memory that held JIT code, merged where they touch."""
    spans = sorted((f.start // PAGE * PAGE, min(-(-f.end // PAGE) * PAGE, LAST_ADDRESS)) for f in functions)
    regions: list[tuple[int, int]] = []
    for start, end in spans:
        if regions and start <= regions[-1][1]:
            regions[-1] = (regions[-1][0], max(regions[-1][1], end))
        else:
            regions.append((start, end))
    return regions


def live_regions(maps_text: str, functions: Sequence[JitFunction]) -> list[tuple[int, int]]:
    """The anonymous executable mappings (from /proc/PID/maps text) that contain JIT code, trimmed to end
    at the last byte of code they hold (a code cache reserves far more than it uses)."""
    by_start = sorted(functions, key=lambda f: f.start)
    starts = [f.start for f in by_start]
    regions: list[tuple[int, int]] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        path = parts[5].strip() if len(parts) > 5 else ""
        if path and not path.startswith("[anon"):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        inside = by_start[bisect_left(starts, lo) : bisect_left(starts, hi)]
        end = min(hi, max((f.end for f in inside), default=lo))
        if inside and end - lo <= _image_bound(inside):  # else page runs of the code: smaller
            regions.append((lo, end))
    return regions


def _image_bound(functions: Sequence[JitFunction]) -> int:
    """The most bytes a section holding ``functions`` may span: their code and a page on each side."""
    return sum(len(f.code or b"") for f in functions) + 2 * PAGE * len(functions)


def code_regions(functions: Sequence[JitFunction], known: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """``known`` regions (a live process's mappings) plus page runs of the functions outside them: one set
    for the functions with code bytes, another (NOBITS) for those without, so that no section's bytes
    span more than code the input carried plus a page on each side of it."""
    outside = [f for f in functions if not any(lo <= f.start < hi for lo, hi in known)]
    regions = sorted(set(known) | set(page_regions(f for f in outside if f.code))
                     | set(page_regions(f for f in outside if not f.code)))
    if len(regions) > MAX_SECTIONS:
        raise ElfLimitError(f"the JIT code is spread over {len(regions)} separate regions "
                            f"(an ELF file holds at most {MAX_SECTIONS} here)")
    return regions


class _Regions:
    """Regions sorted by start; finds the one holding an address (regions rarely overlap: a few steps)."""

    LOOK_BACK = 4

    def __init__(self, regions: Sequence[tuple[int, int]]) -> None:
        self.regions = sorted(regions)
        self.starts = [lo for lo, _ in self.regions]

    def holding(self, start: int, end: int | None = None) -> int | None:
        """The smallest region holding ``start`` (and ``end``, when given) among the few nearest."""
        k = bisect_right(self.starts, start) - 1
        found = [i for i in range(k, max(k - self.LOOK_BACK, -1), -1)
                 if start < self.regions[i][1] and (end is None or end <= self.regions[i][1])]
        return min(found, key=lambda i: self.regions[i][1] - self.regions[i][0], default=None)

    def images(self, functions: Sequence[JitFunction]) -> list[bytes | None]:
        """Each region's bytes at the end of the input (functions in load order: later ones overwrite);
        None for a region no code bytes fall in (nothing is allocated for it)."""
        inside: dict[int, list[JitFunction]] = {}
        for function in functions:
            where = self.holding(function.start, function.end) if function.code else None
            if where is not None:
                inside.setdefault(where, []).append(function)
        images: list[bytes | None] = [None] * len(self.regions)
        for where, loaded in inside.items():
            lo, hi = self.regions[where]
            if hi - lo > _image_bound(loaded):
                continue  # a region made for code-less functions: its bytes would be mostly zeros
            image = bytearray(hi - lo)
            for function in loaded:
                image[function.start - lo : function.end - lo] = function.code
            images[where] = bytes(image)
        return images


class _StringTable:
    def __init__(self) -> None:
        self.data = bytearray(b"\0")
        self._seen: dict[str, int] = {}

    def add(self, text: str) -> int:
        if text not in self._seen:
            self._seen[text] = len(self.data)
            self.data += text.encode("utf-8", "replace").replace(b"\0", b" ") + b"\0"
        return self._seen[text]


def write_elf(path: str, functions: Sequence[JitFunction], elf_mach: int, regions: Sequence[tuple[int, int]],
              byte_order: str = "<", time_unit: str = "s") -> ElfSummary:
    """Write the ELF file atomically; ``functions`` in load order, ``regions`` from :func:`code_regions`.
    Raises OSError."""
    o = byte_order
    shstr, strtab = _StringTable(), _StringTable()
    sections: list[dict] = []  # name, type, flags, addr, data (bytes or None for NOBITS), size, align, ...
    index = _Regions(regions)
    for (lo, hi), image in zip(index.regions, index.images(functions)):
        sections.append(dict(name=f".jit.0x{lo:x}", type=SHT_PROGBITS if image else SHT_NOBITS,
                             flags=SHF_ALLOC | SHF_EXECINSTR, addr=lo, data=image, size=hi - lo, align=16))
    symbols = [struct.pack(o + SYM, 0, 0, 0, 0, 0, 0)]
    digest = hashlib.sha1(struct.pack(o + "I", elf_mach))
    # Replaced code is STB_LOCAL (and locals come first), live code STB_GLOBAL: where several symbols share an
    # address, disassemblers label the bytes (the final code) with the live one.
    ordered = [f for f in functions if f.died is not None] + [f for f in functions if f.died is None]
    for function in ordered:
        name = symbol_name(function, time_unit)
        where = index.holding(function.start)
        shndx = SHN_ABS if where is None else where + 1
        bind = STB_LOCAL if function.died is not None else STB_GLOBAL
        symbols.append(struct.pack(o + SYM, strtab.add(name), (bind << 4) | STT_FUNC, 0, shndx,
                                   function.start, function.size))
        digest.update(f"{function.start:x} {function.size:x} {name}\n".encode("utf-8", "replace"))
    first_global = 1 + sum(1 for f in functions if f.died is not None)
    for section in sections:
        digest.update(section["data"] or b"")
    build_id = digest.digest()
    note = struct.pack(o + "III", 4, len(build_id), NT_GNU_BUILD_ID) + b"GNU\0" + build_id
    sections.append(dict(name=".note.gnu.build-id", type=SHT_NOTE, flags=SHF_ALLOC, addr=0, data=note,
                         size=len(note), align=4))
    symtab_index = len(sections) + 1
    sections.append(dict(name=".symtab", type=SHT_SYMTAB, flags=0, addr=0, data=b"".join(symbols),
                         size=24 * len(symbols), align=8, link=symtab_index + 1, info=first_global, entsize=24))
    sections.append(dict(name=".strtab", type=SHT_STRTAB, flags=0, addr=0, data=bytes(strtab.data),
                         size=len(strtab.data), align=1))
    for section in sections:
        section["name_off"] = shstr.add(section["name"])
    shstrtab_name = shstr.add(".shstrtab")
    sections.append(dict(name=".shstrtab", name_off=shstrtab_name, type=SHT_STRTAB, flags=0, addr=0,
                         data=bytes(shstr.data), size=len(shstr.data), align=1))
    _emit(path, sections, elf_mach, o)
    return ElfSummary(path, [(s["name"], s["addr"], s["size"]) for s in sections if s["flags"] & SHF_EXECINSTR],
                      len(symbols) - 1, build_id.hex())


def _emit(path: str, sections: list[dict], elf_mach: int, o: str) -> None:
    """Lay the sections out, then stream them to the file (no second copy of the code in memory)."""
    pos = struct.calcsize(o + EHDR)
    for section in sections:
        pos += -pos % section["align"]
        section["offset"] = pos
        if section["type"] != SHT_NOBITS:
            pos += len(section["data"])
    shoff = pos + -pos % 8
    ident = b"\x7fELF" + bytes([2, 1 if o == "<" else 2, 1, 0]) + bytes(8)
    with atomic_output(path, "wb") as out:
        written = out.write(struct.pack(o + EHDR, ident, 3, elf_mach, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                                        len(sections) + 1, len(sections)))
        for section in sections:
            written += _write_at(out, written, section["offset"], section["data"]
                                 if section["type"] != SHT_NOBITS else b"")
        _write_at(out, written, shoff, _section_headers(sections, o))


def _write_at(out: BinaryIO, written: int, offset: int, data: bytes) -> int:
    """Pad from ``written`` to ``offset``, write ``data``; the number of bytes written."""
    return out.write(bytes(offset - written)) + out.write(data)


def _section_headers(sections: list[dict], o: str) -> bytes:
    headers = [struct.pack(o + SHDR, *([0] * 10))]
    for s in sections:
        headers.append(struct.pack(o + SHDR, s["name_off"], s["type"], s["flags"], s["addr"], s["offset"],
                                   s["size"], s.get("link", 0), s.get("info", 0), s["align"], s.get("entsize", 0)))
    return b"".join(headers)
