"""HotSpot's compressed streams: UNSIGNED5 (Pack200's variable-length unsigned ints: 6 bits in each byte
from 192 up, the last byte below 192; JDK 20+ shift every byte up by one so none is zero), the signed
"zigzag" form, and the compressed line number table of a ConstMethod built on them.

Every stream is the process's bytes: a value is at most five bytes, a table at most MAX_LINE_ENTRIES
entries, and a stream that runs out or holds an excluded byte ends the decoding (what was decoded stays).
"""
from __future__ import annotations

L = 192  # bytes from L up carry 6 more bits
MAX_BYTES = 5
MAX_LINE_ENTRIES = 65536


class Stream:
    def __init__(self, data: bytes, excluded: int, position: int = 0) -> None:
        self.data = data
        self.excluded = excluded
        self.position = position

    def byte(self) -> int | None:
        if not 0 <= self.position < len(self.data):
            return None
        found = self.data[self.position]
        self.position += 1
        return found

    def uint(self) -> int | None:
        """One UNSIGNED5 value (None: the stream ended or held an excluded byte)."""
        total, shift = 0, 0
        for _ in range(MAX_BYTES):
            byte = self.byte()
            if byte is None or byte < self.excluded:
                return None
            total += (byte - self.excluded) << shift
            if byte < L:
                return total & 0xFFFFFFFF
            shift += 6
        return total & 0xFFFFFFFF

    def signed(self) -> int | None:
        value = self.uint()
        if value is None:
            return None
        decoded = (value >> 1) ^ -(value & 1)
        return decoded - (1 << 32) if decoded >= 1 << 31 else decoded


def line_table(data: bytes, excluded: int) -> tuple[tuple[int, int], ...]:
    """(bci, line) pairs of a compressed line number table (CompressedLineNumberReadStream): a byte per
    entry holding both deltas (bci << 3 | line), 0xFF before two signed deltas, 0 at the end."""
    stream = Stream(data, excluded)
    bci = line = 0
    entries: list[tuple[int, int]] = []
    while len(entries) < MAX_LINE_ENTRIES:
        head = stream.byte()
        if head is None or head == 0:
            break
        if head == 0xFF:
            bci_delta, line_delta = stream.signed(), stream.signed()
            if bci_delta is None or line_delta is None:
                break
            bci, line = bci + bci_delta, line + line_delta
        else:
            bci, line = bci + (head >> 3), line + (head & 7)
        entries.append((bci, line))
    return tuple(entries)


def line_of(table: tuple[tuple[int, int], ...], bci: int) -> int:
    """The line of ``bci`` as Method::line_number_from_bci finds it: the exact entry, else the entry with the
    largest bci below it; 0 when none."""
    best_bci, best_line = -1, 0
    for entry_bci, line in table:
        if entry_bci == bci:
            return line
        if best_bci < entry_bci <= bci:
            best_bci, best_line = entry_bci, line
    return best_line
