"""Hand-made call-frame information for the hostile and edge-case tests: CIEs, FDEs and a minimal x86-64
ELF file around them; mutated copies of real binaries (imported by name: tests/unwind is put on sys.path
by conftest.py)."""
from __future__ import annotations

import struct
from pathlib import Path

SECTION_ADDR = 0x2000  # sh_addr of the hand-made .eh_frame
SHT_PROGBITS, SHT_STRTAB, SHT_NOBITS = 1, 3, 8

# A usual x86-64 CIE program: CFA = rsp + 8, return address at CFA - 8
CIE_INITIAL = bytes([0x0C, 7, 8, 0x90, 1])


def uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def sleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40):
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


class EhFrame:
    """Entries appended in order; ``fde`` encodes its pc pc-relative (sdata4, the "zR" CIE's 0x1b)."""

    def __init__(self, address: int = SECTION_ADDR) -> None:
        self.data = bytearray()
        self.address = address

    def cie(self, initial: bytes = CIE_INITIAL, augmentation: bytes = b"zR", aug_data: bytes = b"\x1b",
            ra: int = 16, data_align: int = -8, version: int = 1) -> int:
        body = bytes([version]) + augmentation + b"\0" + uleb(1) + sleb(data_align) + bytes([ra])
        if augmentation.startswith(b"z"):
            body += uleb(len(aug_data)) + aug_data
        return self.raw(struct.pack("<I", 0) + body + initial)

    def fde(self, cie_at: int, pc: int, size: int, program: bytes = b"", aug: bool = True) -> int:
        at = len(self.data)
        pc_field = at + 8
        head = struct.pack("<Ii", at + 4 - cie_at, pc - (self.address + pc_field)) + struct.pack("<i", size)
        return self.raw(head + (uleb(0) if aug else b"") + program)

    def raw(self, body: bytes, length: int | None = None) -> int:
        """An entry with ``body`` after its length (``length`` forces a wrong one); its offset."""
        at = len(self.data)
        padded = body + b"\0" * (-(len(body) + 4) % 8)  # DW_CFA_nop padding
        self.data += struct.pack("<I", len(padded) if length is None else length) + padded
        return at

    def bytes(self) -> bytes:
        return bytes(self.data)


def elf(sections: dict[str, bytes], addresses: dict[str, int] | None = None,
        nobits: tuple[str, ...] = ()) -> bytes:
    """An x86-64 ELF file holding ``sections`` (name -> bytes), no segments."""
    addresses = addresses or {".eh_frame": SECTION_ADDR}
    names = [""] + list(sections) + [".shstrtab"]
    shstrtab = b"\0".join(name.encode() for name in names) + b"\0"
    name_offsets, pos = [], 0
    for name in names:
        name_offsets.append(pos)
        pos += len(name) + 1
    body = bytearray(b"\0" * 64)
    placed = []
    for name, data in list(sections.items()) + [(".shstrtab", shstrtab)]:
        placed.append((len(body), len(data)))
        body += data
        body += b"\0" * (-len(body) % 8)
    shoff = len(body)
    headers = [b"\0" * 64]
    for index, ((offset, size), name) in enumerate(zip(placed, names[1:]), 1):
        kind = SHT_STRTAB if name == ".shstrtab" else SHT_NOBITS if name in nobits else SHT_PROGBITS
        headers.append(struct.pack("<IIQQQQIIQQ", name_offsets[index], kind, 2, addresses.get(name, 0), offset, size,
                                   0, 0, 8, 0))
    body += b"".join(headers)
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, len(headers),
                                 len(headers) - 1)
    body[:64] = header
    return bytes(body)


def mutated_copy(binary: Path, mutations: list[tuple[int, int]], directory: Path) -> Path:
    """A copy of ``binary`` in ``directory`` with byte ``position % size`` set to ``value`` for each of
    ``mutations`` (hypothesis draws them: MUTATIONS)."""
    data = bytearray(binary.read_bytes())
    for position, value in mutations:
        data[position % len(data)] = value
    path = directory / "mutated"
    path.write_bytes(bytes(data))
    return path
