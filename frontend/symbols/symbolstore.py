"""Objects' function symbols kept on disk between runs, as the unwind tables are (frontend/unwind/tablestore.py).

Reading a file's symbols is pure Python: its .symtab (or its debug file's, or MiniDebugInfo's, or .dynsym)
and the FDEs of the code no symbol covers. A whole-machine recording names frames of a hundred objects or
more, each read again in every run: under an exec storm that was most of what a 30 s recording cost after
its window (issue 42). An object's table read once is stored and read back by the later runs that meet the
same file.

The key is the file's identity with its change time (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns, as
the unwind tables' store keys them: not the build-id, a claim its owner makes) and a fingerprint of the code
that reads symbols. An entry made from a separate debug file names it with its identity, and is used only
while that file is unchanged; an entry made without one is not used once a debug file for its build-id is
installed. Only tables read without a problem are stored.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from array import array
from pathlib import Path

from optrace import __version__
from optrace.cachedir import CacheDirectory, EntryStore, default_directory
from optrace.frontend.symbols.symbol import SymbolTable

MAGIC = b"optrace symbols 1\n"
MAX_PAYLOAD_BYTES = 256 << 20
MAX_STORE_BYTES = 256 << 20
READER_MODULES = ("debuginfo", "dso", "elffile", "fderanges", "symbol")  # in frontend/symbols

StoreKey = str
Segments = list[tuple[int, int, int]]  # (file offset, size, vaddr) of each PT_LOAD


@functools.cache
def reader_fingerprint() -> str:
    digest = hashlib.sha256(__version__.encode())
    for module in READER_MODULES:
        digest.update((Path(__file__).parent / f"{module}.py").read_bytes())
    return digest.hexdigest()


def file_key(fd: int) -> list[int]:
    info = os.fstat(fd)
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def path_key(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def store_key(fd: int) -> StoreKey:
    return hashlib.sha256(json.dumps([reader_fingerprint(), file_key(fd)]).encode()).hexdigest()[:40]


class SymbolStore(EntryStore):
    """The stored symbol tables of one directory (see the module docstring)."""

    def __init__(self, directory: Path | None) -> None:
        self.entries = CacheDirectory(directory, MAGIC, MAX_PAYLOAD_BYTES, MAX_STORE_BYTES)

    @classmethod
    def default(cls) -> "SymbolStore":
        return cls(default_directory("symbols"))

    def load(self, key: StoreKey, debug_path: str | None) -> tuple[Segments, SymbolTable, str] | None:
        """(segments, table, symbol source) stored under ``key``; ``debug_path``: the debug file found now by
        the object's build-id (None: none), which must be the one the entry was read from, if any."""
        entry = self.entries.read(key)
        if entry is None:
            return None
        header, payload = entry
        try:
            debug = header["debug"]
            if debug is not None and path_key(debug[0]) != debug[1] or debug is None and debug_path is not None:
                return None  # a debug file changed, or one came since
            counts = header["counts"]
            arrays = []
            at = 0
            for code, count in zip("QQI", counts[:3]):
                part = array(code)
                part.frombytes(payload[at:at + count * part.itemsize])
                at += count * part.itemsize
                arrays.append(part)
            names = payload[at:at + counts[3]]
            table = SymbolTable.from_arrays(*arrays, names)
            segments = [tuple(segment) for segment in header["segments"]]
            source = header["source"]
        except (KeyError, TypeError, ValueError, IndexError):
            self.entries.rejected()
            return None
        self.entries.accepted(key)
        return segments, table, source

    def save(self, key: StoreKey, segments: Segments, table: SymbolTable, source: str,
             debug_path: str | None) -> None:
        """Store what was read (from ``debug_path``'s symbols when not None); a failure costs only the entry."""
        starts, ends, name_ends, names = table.to_arrays()
        debug = None
        if debug_path is not None:
            identity = path_key(debug_path)
            if identity is None:
                return
            debug = [debug_path, identity]
        header = {"counts": [len(starts), len(ends), len(name_ends), len(names)], "segments": segments,
                  "source": source, "debug": debug}
        self.entries.write(key, header, starts.tobytes() + ends.tobytes() + name_ends.tobytes() + names)
