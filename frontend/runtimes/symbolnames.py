"""A few symbols of an ELF file found by name, without decoding its symbol tables whole; the code at an address
(shared by the runtimes: CPython's interpreter file, HotSpot's libjvm)."""
from __future__ import annotations

import struct

import capstone

from optrace.frontend.symbols.elffile import SHT_NOBITS, ElfFile
from optrace.frontend.symbols.symbol import MAX_TABLE_BYTES, SHN_UNDEF, STT_FUNC

MAX_NAME_HITS = 16  # places one wanted name is looked for in a string table
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size


def find_symbols(elf: ElfFile, section_name: str, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """{name: (st_value, st_size)} of the defined symbols of ``section_name`` called one of ``names``."""
    section = elf.section_by_name(section_name)
    if section is None or section.type == SHT_NOBITS or section.entsize != _SYMBOL.size:
        return {}
    strings = elf.section_data(elf.section(section.link), MAX_TABLE_BYTES)
    wanted = {offset: name for name in names for offset in _string_offsets(strings, name)}
    if not wanted:
        return {}
    data = elf.section_data(section, MAX_TABLE_BYTES)
    found: dict[str, tuple[int, int]] = {}
    for name_at, _info, _other, shndx, value, size in _SYMBOL.iter_unpack(data[:len(data) - len(data) % _SYMBOL.size]):
        name = wanted.get(name_at)
        if name is not None and shndx != SHN_UNDEF and value and name not in found:
            found[name] = (value, size)
    return found


def _string_offsets(strings: bytes, name: str) -> list[int]:
    """Where in a string table a symbol's st_name could point to read ``name`` (its own string, or the tail
    of a longer one the linker shared it with)."""
    key = name.encode() + b"\0"
    offsets = []
    at = strings.find(key)
    while at >= 0 and len(offsets) < MAX_NAME_HITS:
        offsets.append(at)
        at = strings.find(key, at + 1)
    return offsets


def function_starts(elf: ElfFile, section_name: str) -> set[int]:
    """The addresses where the defined functions of ``section_name`` start."""
    section = elf.section_by_name(section_name)
    if section is None or section.type == SHT_NOBITS or section.entsize != _SYMBOL.size:
        return set()
    data = elf.section_data(section, MAX_TABLE_BYTES)
    return {value for _name, info, _other, shndx, value, _size in
            _SYMBOL.iter_unpack(data[:len(data) - len(data) % _SYMBOL.size])
            if info & 0xF == STT_FUNC and shndx != SHN_UNDEF and value}


def code_at(elf: ElfFile, address: int, size: int) -> bytes:
    """Up to ``size`` bytes of the section holding link-time ``address``, from there (b"" outside any)."""
    section = next((s for s in elf.sections() if s.addr <= address < s.addr + s.size and s.type != SHT_NOBITS),
                   None)
    if section is None:
        return b""
    return elf.read_at(section.offset + address - section.addr, min(size, section.addr + section.size - address))


_RELA = struct.Struct("<QQq")  # Elf64_Rela: r_offset, r_info, r_addend
PLT_SECTIONS = (".plt.sec", ".plt", ".plt.got")
PLT_STUB = 16  # bytes per PLT entry on x86_64
MAX_PLT_STUBS = 1 << 14


def imported_functions(elf: ElfFile) -> dict[int, str]:
    """{address called: name} of the imported functions a call can go to: each PLT stub's address, and each
    GOT slot's (a call through the GOT, -fno-plt), from .rela.plt and .dynsym."""
    rela, dynsym = elf.section_by_name(".rela.plt"), elf.section_by_name(".dynsym")
    if rela is None or dynsym is None or rela.type == SHT_NOBITS or dynsym.entsize != _SYMBOL.size:
        return {}
    symbols = elf.section_data(dynsym, MAX_TABLE_BYTES)
    strings = elf.section_data(elf.section(dynsym.link), MAX_TABLE_BYTES)
    data = elf.section_data(rela, MAX_TABLE_BYTES)
    slots: dict[int, str] = {}
    for offset, info, _addend in _RELA.iter_unpack(data[:len(data) - len(data) % _RELA.size]):
        at = (info >> 32) * _SYMBOL.size
        if at + _SYMBOL.size <= len(symbols):
            name_at = _SYMBOL.unpack_from(symbols, at)[0]
            slots[offset] = strings[name_at:strings.find(b"\0", name_at)].decode("ascii", "replace")
    found = dict(slots)
    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    for section in filter(None, map(elf.section_by_name, PLT_SECTIONS)):
        code = code_at(elf, section.addr, min(section.size, MAX_PLT_STUBS * PLT_STUB))
        for stub in range(0, len(code) - PLT_STUB + 1, PLT_STUB):
            slot = _jump_slot(disassembler, code[stub:stub + PLT_STUB], section.addr + stub)
            if slot in slots:
                found[section.addr + stub] = slots[slot]
    return found


def _jump_slot(disassembler, stub: bytes, address: int) -> int | None:
    """The GOT slot a PLT stub jumps through (``jmp [rip + X]``, after an endbr64 or with a bnd prefix)."""
    for _at, size, mnemonic, operand in disassembler.disasm_lite(stub, address):
        if mnemonic in ("jmp", "bnd jmp") and operand.startswith("qword ptr [rip"):
            return _at + size + int(operand.split("rip")[1].strip(" +]"), 0)
    return None
