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
import sys
from array import array

FIRST_BLOCK = 64 << 10
BLOCK = 1 << 20


class NameStore:
    """Interns names: :meth:`intern` returns the same id for the same name; :meth:`get` gives it back."""

    def __init__(self) -> None:
        self.bytes = 0  # UTF-8 bytes of the distinct names held
        # The first block is a bytearray that grows up to FIRST_BLOCK bytes (most tables are small, and a
        # mapping each would count against the process's map limit); the others are mapped, BLOCK or more.
        self._blocks: list[bytearray | mmap.mmap] = [bytearray()]
        self._used = 0  # bytes used in the last block
        self._room = FIRST_BLOCK  # bytes left in it
        self._block = array("I")
        self._offset = array("I")
        self._length = array("I")
        self._ids: dict[int, int] = {}  # hash of a name's bytes -> the id of the first name with that hash

    def __len__(self) -> int:
        return len(self._length)

    def intern(self, name: str, room: int = sys.maxsize) -> tuple[int | None, int]:
        """``name``'s id and the bytes it added: stored now when it is new and its UTF-8 bytes fit in
        ``room``, else (None, 0). One call per perf-map line: kept short (a 1,000,000-line map)."""
        data = name.encode("utf-8", "surrogateescape")
        key = hash(data)
        found = self._ids.get(key)
        if found is not None and self._bytes(found) == data:
            return found, 0
        size = len(data)
        if size > room:
            return None, 0
        if size > self._room:
            self._new_block(size)
        name_id, offset = len(self._length), self._used
        self._used += size
        self._room -= size
        self._blocks[-1][offset:self._used] = data  # at a bytearray's end: it grows
        self._block.append(len(self._blocks) - 1)
        self._offset.append(offset)
        self._length.append(size)
        if found is None:  # a hash collision: the second name is stored, not indexed
            self._ids[key] = name_id
        self.bytes += size
        return name_id, size

    def get(self, name_id: int) -> str:
        return self._bytes(name_id).decode("utf-8", "surrogateescape")

    def _new_block(self, size: int) -> None:
        block = mmap.mmap(-1, max(BLOCK, size or 1))
        self._blocks.append(block)
        self._used, self._room = 0, len(block)

    def _bytes(self, name_id: int) -> bytes:
        offset = self._offset[name_id]
        return self._blocks[self._block[name_id]][offset:offset + self._length[name_id]]
