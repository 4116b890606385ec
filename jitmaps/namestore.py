"""Distinct JIT symbol names, stored as UTF-8 in a few anonymous memory blocks instead of one ``str`` each.

Why: a daemon (``optrace serve``) builds a table for every JIT process it samples and drops it a drain after
the process exits. With one ``str`` per name (and the ``dict`` that interned it), a 20,000-name perf map put
~5 MB of small objects into CPython's allocator arenas; an arena is given back to the system only when every
object in it is freed, so objects allocated in between kept them and the daemon's RSS swung by 10-15 MB
(bench/README.md, serve soak). Here the names themselves live in blocks mapped with ``mmap`` (unmapped as
soon as the table is dropped, whatever else was allocated meanwhile; a table's first 64 KiB of names are
one ``bytearray``) and each name costs three array slots and one ``dict`` entry keyed by its hash.
"""
from __future__ import annotations

import mmap
from array import array

FIRST_BLOCK = 64 << 10
BLOCK = 1 << 20


class NameStore:
    """Interns names: :meth:`intern` returns the same id for the same name; :meth:`get` gives it back."""

    def __init__(self) -> None:
        self.bytes = 0  # UTF-8 bytes of the distinct names held
        self._blocks: list[bytearray | mmap.mmap] = []
        self._used = 0  # bytes used in the last block, when it is mapped
        self._block = array("I")
        self._offset = array("I")
        self._length = array("I")
        self._ids: dict[int, int] = {}  # hash of a name's bytes -> the id of the first name with that hash

    def __len__(self) -> int:
        return len(self._length)

    def find(self, name: str) -> tuple[int | None, bytes]:
        """The id of ``name`` if it is held (None if not), and its UTF-8 bytes."""
        data = name.encode("utf-8", "surrogateescape")
        found = self._ids.get(hash(data))
        if found is not None and self._bytes(found) == data:
            return found, data
        return None, data

    def add(self, data: bytes) -> int:
        """Store a name that :meth:`find` did not hold; its new id."""
        block_index, offset = self._place(data)
        name_id = len(self._length)
        self._block.append(block_index)
        self._offset.append(offset)
        self._length.append(len(data))
        self._ids.setdefault(hash(data), name_id)  # a hash collision: the second name is stored, not indexed
        self.bytes += len(data)
        return name_id

    def _place(self, data: bytes) -> tuple[int, int]:
        """Copy ``data`` into a block: the first one grows up to FIRST_BLOCK bytes (most tables are small,
        and a mapping each would count against the process's map limit), the others are mapped."""
        if not self._blocks:
            self._blocks.append(bytearray())
        block = self._blocks[-1]
        if isinstance(block, bytearray) and len(block) + len(data) <= FIRST_BLOCK:
            block += data
            return 0, len(block) - len(data)
        if isinstance(block, bytearray) or self._used + len(data) > len(block):
            block = mmap.mmap(-1, max(BLOCK, len(data) or 1))
            self._blocks.append(block)
            self._used = 0
        offset, self._used = self._used, self._used + len(data)
        block[offset:self._used] = data
        return len(self._blocks) - 1, offset

    def intern(self, name: str) -> int:
        found, data = self.find(name)
        return self.add(data) if found is None else found

    def get(self, name_id: int) -> str:
        return self._bytes(name_id).decode("utf-8", "surrogateescape")

    def _bytes(self, name_id: int) -> bytes:
        offset = self._offset[name_id]
        return self._blocks[self._block[name_id]][offset:offset + self._length[name_id]]
