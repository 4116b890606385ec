"""Perf-map names left in their file: a line offset per name, read back when a sample needs it.

Why: ``optrace serve`` keeps a table for every live JIT process it samples, and a copy of the names cost
more than the rest of the table: a 20,000-name map of 200-byte names held 6-7 MB while its process lived
(4 MB of names, ~2 MB to intern them), which is what kept serve's RSS from staying flat under process churn
(bench/README.md, serve soak). Here a name costs 18 bytes: its file, its line's offset and its hash.

The file is the descriptor optrace opened under the JIT-file rules (:mod:`optrace.jitmaps.trust`), kept
open (``dup``), so a map unlinked at the process's exit, or replaced by a new one, still reads as it was.
A map rewritten in place is another matter: a line read back is used only if it still parses to a name
with the same hash, else the name is unknown (None). A line is read with ``pread`` of at most
:data:`~optrace.jitmaps.perfmap.MAX_LINE` bytes, from a regular file on a disk file system: bounded, never
blocking. How many descriptors all tables keep together is capped by their shared
:class:`~optrace.jitmaps.symtable.SymbolBudget`; past it, names are copied as before.
"""
from __future__ import annotations

import os
from array import array

from optrace.jitmaps.perfmap import MAX_LINE, parse_line

FIRST_READ = 512  # bytes read first for a line: JVM and V8 names are rarely longer


class MapLines:
    """Name references into kept perf-map descriptors: :meth:`add` returns an id, :meth:`get` the name."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self._file = array("H")
        self._offset = array("Q")
        self._hash = array("q")

    def __len__(self) -> int:
        return len(self._offset)

    def keep(self, fd: int) -> int:
        """Keep a duplicate of ``fd`` (the caller closes its own); the file's id for :meth:`add`."""
        self.fds.append(os.dup(fd))
        return len(self.fds) - 1

    def add(self, file_id: int, offset: int, name: str) -> int:
        """A reference to the line at ``offset`` of a kept file, whose name is ``name`` now."""
        self._file.append(file_id)
        self._offset.append(offset)
        self._hash.append(hash(name))
        return len(self._offset) - 1

    def keep_only(self, refs: list[int]) -> dict[int, int]:
        """Drop every reference not in ``refs``; returns old id -> new id for those kept."""
        order = sorted(set(refs))
        self._file = array("H", map(self._file.__getitem__, order))
        self._offset = array("Q", map(self._offset.__getitem__, order))
        self._hash = array("q", map(self._hash.__getitem__, order))
        return {old: new for new, old in enumerate(order)}

    def key(self, ref: int) -> int:
        """What two references to the same name share (the name's hash, salted per process)."""
        return self._hash[ref]

    def get(self, ref: int) -> str | None:
        """The name, read back; None when the file no longer has it at that offset."""
        file_id = self._file[ref]
        if file_id >= len(self.fds):  # closed: the table was released
            return None
        found = parse_line(self._line(self.fds[file_id], self._offset[ref]))
        if found is None or hash(found.name) != self._hash[ref]:
            return None
        return found.name

    @staticmethod
    def _line(fd: int, offset: int) -> bytes:
        try:
            data = os.pread(fd, FIRST_READ, offset)
            if b"\n" not in data and len(data) == FIRST_READ:
                data = os.pread(fd, MAX_LINE + 1, offset)
        except OSError:
            return b""
        return data.split(b"\n", 1)[0]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
