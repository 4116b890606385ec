"""A bounded decoder of DWARF call-frame information (``.eh_frame`` and ``.debug_frame``) for x86-64,
reduced to what a stack walker needs: the CFA rule, the caller's rbp rule and whether the return
address is where the ABI puts it.

Written here rather than taken from pyelftools because of speed: pyelftools decodes every instruction
into objects and builds a full register table per row; on gcc's ``cc1`` (45,201 FDEs, 436,539 rows) it
takes far more than the 2 s the table build is allowed (figures in bench/README.md). This decoder
interprets each distinct instruction sequence once per CIE (most FDEs of a compiler's output repeat a
few prologue/epilogue shapes) and keeps only three registers' rules. pyelftools stays the independent
reference in the tests.

Everything in the section comes from the file's owner: every length is checked against the section,
the entry count, the length of an FDE's program and the remember-state depth are capped, an FDE must point
at a CIE (never at another FDE or outside the section), and any inconsistency raises
:class:`~optrace.frontend.symbols.leb128.DwarfError` (a MalformedInput), after which the caller keeps what
was decoded so far.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from optrace.frontend.symbols.elffile import SHT_NOBITS, ElfFile, SectionHeader
from optrace.frontend.symbols.leb128 import DwarfError, sleb128, uleb128

# Limits (real files: cc1 has 45,201 FDEs; most FDE programs are a few dozen bytes).
MAX_SECTION_BYTES = 64 << 20  # .eh_frame / .debug_frame read (cc1's .eh_frame: 2.3 MB)
MAX_ENTRIES = 1 << 21  # CIEs + FDEs in one section
MAX_PROGRAM_BYTES = 1 << 18  # of an FDE's or a CIE's instructions, so at most as many (cc1's longest: 20,051)
MAX_STATE_DEPTH = 64  # DW_CFA_remember_state nesting
MAX_AUGMENTATION = 16  # characters of a CIE's augmentation string

# DWARF register numbers on x86-64
REG_RBP, REG_RSP, REG_RA = 6, 7, 16

# DW_EH_PE pointer encodings
PE_OMIT = 0xFF
PE_FORMAT = 0x0F
PE_APPLICATION = 0x70
PE_ABSPTR, PE_ULEB128, PE_UDATA2, PE_UDATA4, PE_UDATA8 = 0x00, 0x01, 0x02, 0x03, 0x04
PE_SLEB128, PE_SDATA2, PE_SDATA4, PE_SDATA8 = 0x09, 0x0A, 0x0B, 0x0C
PE_PCREL, PE_TEXTREL, PE_DATAREL, PE_FUNCREL, PE_ALIGNED = 0x10, 0x20, 0x30, 0x40, 0x50
PE_INDIRECT = 0x80
_FIXED = {PE_UDATA2: struct.Struct("<H"), PE_UDATA4: struct.Struct("<I"), PE_UDATA8: struct.Struct("<Q"),
          PE_SDATA2: struct.Struct("<h"), PE_SDATA4: struct.Struct("<i"), PE_SDATA8: struct.Struct("<q")}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_S32_PAIR = struct.Struct("<ii")

# The x86-64 PLT CFA expression: DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
# DW_OP_litK; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus  (CFA = rsp + N + ((rip & 15) >= K) * 8).
# binutils writes K = 11 for the lazy .plt and K = 10 for the IBT one (endbr64 first).
DW_OP_LIT0, DW_OP_BREG7, DW_OP_BREG16 = 0x30, 0x77, 0x80
_PLT_HEAD = bytes([DW_OP_BREG16, 0, DW_OP_LIT0 + 15, 0x1A])  # breg16 0; lit15; and
_PLT_TAIL = bytes([0x2A, DW_OP_LIT0 + 3, 0x24, 0x22])  # ge; lit3; shl; plus


@dataclass(frozen=True, slots=True)
class Cie:
    offset: int  # in the section: the key of the FDE programs' cache
    code_align: int
    data_align: int
    ra_register: int
    fde_encoding: int
    augmented: bool  # "z": FDEs carry an augmentation-data length
    initial: bytes  # initial instructions
    signal_frame: bool


class Fde(NamedTuple):  # a tuple: made once per FDE, tens of thousands per file
    start: int  # ELF virtual address
    end: int
    cie: Cie
    program: bytes


@dataclass(frozen=True)
class Section:
    data: bytes
    address: int  # sh_addr (pc-relative pointers), 0 for .debug_frame
    eh_frame: bool  # .eh_frame layout (CIE id 0, relative CIE pointers) rather than .debug_frame's
    data_base: int = 0  # base of DW_EH_PE_datarel pointers (the GOT)


CFI_SECTIONS = (".eh_frame", ".debug_frame")  # where both describe a pc, .eh_frame's FDE is the one used


def cfi_sections(elf: ElfFile) -> list[SectionHeader]:
    """The CFI sections ``elf`` holds bytes of, in CFI_SECTIONS' order (a debug file's .eh_frame is NOBITS)."""
    headers = (elf.section_by_name(name) for name in CFI_SECTIONS)
    return [header for header in headers if header is not None and header.type != SHT_NOBITS and header.size]


def read_section(elf: ElfFile, header: SectionHeader) -> Section:
    """The section ``header`` of ``elf`` (one of CFI_SECTIONS) as :func:`read_fdes` takes it; BudgetExceeded
    past MAX_SECTION_BYTES, ElfFormatError when the file is cut short."""
    data = elf.section_data(header, MAX_SECTION_BYTES)
    eh_frame = header.name == ".eh_frame"
    got = elf.section_by_name(".got.plt") or elf.section_by_name(".got")
    return Section(data, header.addr if eh_frame else 0, eh_frame, got.addr if got else 0)


def read_fdes(section: Section) -> Iterator[Fde]:
    """Every FDE of the section, in section order. Raises DwarfError at the first malformed entry (the
    FDEs yielded before it are sound)."""
    data = section.data
    size = len(data)
    cies: dict[int, Cie] = {}
    pos = 0
    for _ in range(MAX_ENTRIES):
        if pos + 4 > size:
            return
        start = pos
        length, pos, offset_size = _entry_length(data, pos)
        if length == 0:
            if section.eh_frame:
                return  # the terminator libgcc and binutils stop at
            continue
        end = pos + length
        if end > size or length < offset_size:
            raise DwarfError(f"entry at {start:#x} runs past the section")
        cie_id = _U32.unpack_from(data, pos)[0] if offset_size == 4 else _U64.unpack_from(data, pos)[0]
        if _is_cie(cie_id, offset_size, section.eh_frame):
            cies[start] = _read_cie(data, start, pos + offset_size, end)
        else:
            cie_at = pos - cie_id if section.eh_frame else cie_id
            cie = cies.get(cie_at) or _cie_at(data, cie_at, section, cies)
            yield _read_fde(section, cie, pos + offset_size, end)
        pos = end
    raise DwarfError(f"more than {MAX_ENTRIES} entries")


def _entry_length(data: bytes, pos: int) -> tuple[int, int, int]:
    """(length, position after the length field, size of offsets in the entry: 4 or 8)."""
    length = _U32.unpack_from(data, pos)[0]
    if length != 0xFFFFFFFF:
        return length, pos + 4, 4
    if pos + 12 > len(data):
        raise DwarfError(f"64-bit entry length at {pos:#x} runs past the section")
    return _U64.unpack_from(data, pos + 4)[0], pos + 12, 8


def _is_cie(cie_id: int, offset_size: int, eh_frame: bool) -> bool:
    if eh_frame:
        return cie_id == 0
    return cie_id == (0xFFFFFFFF if offset_size == 4 else 0xFFFFFFFFFFFFFFFF)


def _cie_at(data: bytes, at: int, section: Section, cies: dict[int, Cie]) -> Cie:
    """A CIE that comes after its FDE in the section (allowed): read it where it is, once."""
    if not 0 <= at <= len(data) - 4:
        raise DwarfError(f"CIE pointer {at:#x} outside the section")
    length, pos, offset_size = _entry_length(data, at)
    end = pos + length
    if length < offset_size or end > len(data):
        raise DwarfError(f"CIE at {at:#x} runs past the section")
    cie_id = int.from_bytes(data[pos:pos + offset_size], "little")
    if not _is_cie(cie_id, offset_size, section.eh_frame):
        raise DwarfError(f"FDE points at {at:#x}, which is not a CIE")
    cie = cies[at] = _read_cie(data, at, pos + offset_size, end)
    return cie


def _read_cie(data: bytes, at: int, pos: int, end: int) -> Cie:
    try:
        return _parse_cie(data, at, pos, end)
    except (IndexError, struct.error) as err:
        raise DwarfError(f"CIE at {at:#x} is truncated") from err


def _parse_cie(data: bytes, at: int, pos: int, end: int) -> Cie:
    version = data[pos]
    if version not in (1, 3, 4):
        raise DwarfError(f"CIE at {at:#x} has version {version}")
    nul = data.find(b"\0", pos + 1, min(end, pos + 2 + MAX_AUGMENTATION))
    if nul < 0:
        raise DwarfError(f"CIE at {at:#x} has no augmentation string")
    augmentation = data[pos + 1:nul].decode("latin-1")
    pos = nul + 1
    if version == 4:  # address_size, segment_selector_size
        if data[pos] != 8 or data[pos + 1] != 0:
            raise DwarfError(f"CIE at {at:#x}: address size {data[pos]}, segment size {data[pos + 1]}")
        pos += 2
    code_align, pos = uleb128(data, pos, end)
    data_align, pos = sleb128(data, pos, end)
    if version == 1:
        ra_register, pos = data[pos], pos + 1
    else:
        ra_register, pos = uleb128(data, pos, end)
    fde_encoding, signal, pos = _augmentation(data, at, augmentation, pos, end)
    if pos > end:
        raise DwarfError(f"CIE at {at:#x} runs past its length")
    return Cie(at, code_align, data_align, ra_register, fde_encoding, augmentation.startswith("z"),
               bytes(data[pos:end]), signal)


def _augmentation(data: bytes, at: int, augmentation: str, pos: int, end: int) -> tuple[int, bool, int]:
    """(FDE pointer encoding, signal frame, position of the initial instructions)."""
    if not augmentation:
        return PE_ABSPTR, False, pos
    if augmentation[0] != "z":
        raise DwarfError(f"CIE at {at:#x} has augmentation {augmentation!r}")
    size, pos = uleb128(data, pos, end)
    after = pos + size
    if after > end:
        raise DwarfError(f"CIE at {at:#x}: augmentation data runs past the entry")
    encoding, signal = PE_ABSPTR, False
    for letter in augmentation[1:]:
        if letter == "R":
            encoding, pos = data[pos], pos + 1
        elif letter == "L":
            pos += 1
        elif letter == "P":
            personality_encoding = data[pos]
            _, pos = read_pointer(data, pos + 1, personality_encoding & ~PE_INDIRECT, 0, 0)
        elif letter == "S":
            signal = True
        else:
            break  # an augmentation we don't know: its data is skipped thanks to "z"
    return encoding, signal, after


def _read_fde(section: Section, cie: Cie, pos: int, end: int) -> Fde:
    data = section.data
    try:
        if cie.fde_encoding == PE_PCREL | PE_SDATA4:  # what gcc and gas write: the fast path
            start, size = _S32_PAIR.unpack_from(data, pos)
            start += section.address + pos
            pos += 8
        else:
            start, pos = read_pointer(data, pos, cie.fde_encoding, section.address, section.data_base)
            size, pos = read_pointer(data, pos, cie.fde_encoding & PE_FORMAT, 0, 0)
        if cie.augmented:
            skip, pos = uleb128(data, pos, end)
            pos += skip
    except (IndexError, struct.error) as err:
        raise DwarfError(f"FDE before {end:#x} is truncated") from err
    if pos > end:
        raise DwarfError(f"FDE before {end:#x} runs past its length")
    return Fde(start & 0xFFFFFFFFFFFFFFFF, (start + size) & 0xFFFFFFFFFFFFFFFF, cie, data[pos:end])


def read_pointer(data: bytes, pos: int, encoding: int, section_address: int, data_base: int) -> tuple[int, int]:
    """A DW_EH_PE-encoded pointer at ``pos``: (value, position after it)."""
    if encoding == PE_OMIT:
        return 0, pos
    application = encoding & PE_APPLICATION
    if application == PE_ALIGNED:
        pos = (pos + 7) & ~7
    base = {0: 0, PE_PCREL: section_address + pos, PE_DATAREL: data_base, PE_ALIGNED: 0}.get(application)
    if base is None:
        raise DwarfError(f"pointer encoding {encoding:#x} is not supported")
    fmt = encoding & PE_FORMAT
    if fmt == PE_ABSPTR:
        value, pos = _U64.unpack_from(data, pos)[0], pos + 8
    elif fmt == PE_ULEB128:
        value, pos = uleb128(data, pos, len(data))
    elif fmt == PE_SLEB128:
        value, pos = sleb128(data, pos, len(data))
    elif fmt in _FIXED:
        reader = _FIXED[fmt]
        value, pos = reader.unpack_from(data, pos)[0], pos + reader.size
    else:
        raise DwarfError(f"pointer encoding {encoding:#x} is not supported")
    return base + value, pos


def plt_threshold(expression: bytes) -> tuple[int, int] | None:
    """(N, K) when ``expression`` is the x86-64 PLT pattern CFA = rsp + N + ((rip & 15) >= K) * 8."""
    if len(expression) < 11 or expression[0] != DW_OP_BREG7:
        return None
    try:
        offset, pos = sleb128(expression, 1, len(expression))
    except DwarfError:
        return None
    rest = expression[pos:]
    if len(rest) != 9 or rest[:4] != _PLT_HEAD or rest[5:] != _PLT_TAIL or not 0 <= rest[4] - DW_OP_LIT0 < 16:
        return None
    return offset, rest[4] - DW_OP_LIT0
