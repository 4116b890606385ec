"""Converted unwind tables kept on disk between runs, as perf keeps its build-id cache in ~/.debug.

Converting a file's CFI is pure Python: in a 30 s whole-machine recording here, the tables of libc,
python3.11 and a dozen other libraries took 0.11 s of the recording's 0.86 s of CPU, again in every run,
though these files change only when a package is upgraded. A table converted once is stored and read
back (0.55 ms of CPU for python3.11's 28k rows, 1.6 ms for 65k) by every later session that meets
the same file.

The key is the file's identity with its change time: (st_dev, st_ino, st_size, st_mtime_ns,
st_ctime_ns), and a fingerprint of the converter's own source, so a new optrace converts again. Not the
build-id, a claim its owner makes (see cache.py). A file's owner can set its mtime but not its ctime,
which any write or chmod moves: a file rewritten in place, or another file that gets a freed inode
number, never matches a stored table.

The store is a cache directory ``unwind`` (optrace/cachedir.py: root's in /var/cache/optrace, private to
the user, entries opened without following links or blocking, checksummed, replaced when bad). Only
tables converted without a problem are stored, so a bad file is reported in every run. The store holds
at most MAX_STORE_BYTES: the least recently used entries go first.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from optrace import __version__
from optrace.cachedir import CacheDirectory, EntryStore, default_directory as cache_directory
from optrace.frontend.symbols import cfi
from optrace.frontend.symbols.buildid import FileIdentity
from optrace.frontend.symbols.leb128 import DwarfError
from optrace.frontend.unwind import row, rules, table, unwindfile
from optrace.frontend.unwind.table import MAX_ROWS, ROW
from optrace.frontend.unwind.unwindfile import UnwindFile, decode_unwind_file, encode_unwind_file

MAGIC = b"optrace unwind table 1\n"
MAX_STORE_BYTES = 256 << 20
# The modules whose code decides a table's rows: a change to any of them is a new fingerprint.
CONVERTER_MODULES = (cfi, rules, row, table, unwindfile)

StoreKey = str


def default_directory() -> Path | None:
    """Where this user's tables are stored (None: not at all)."""
    return cache_directory("unwind")


@functools.cache
def converter_fingerprint() -> str:
    """optrace's version and a SHA-256 of the converter's sources."""
    digest = hashlib.sha256(__version__.encode())
    for module in CONVERTER_MODULES:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def store_key(fd: int) -> StoreKey:
    """The entry name of the file open at ``fd``."""
    info = os.fstat(fd)
    identity = [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
    return hashlib.sha256(json.dumps([converter_fingerprint(), identity]).encode()).hexdigest()[:40]


class TableStore(EntryStore):
    """The stored tables of one directory. ``problem`` says why a store is not used (None when it is);
    ``stats`` counts ``stored_hits``, ``stored_misses``, ``stored_writes`` and ``stored_bad`` (entries
    that were not what this module writes)."""

    def __init__(self, directory: Path | None) -> None:
        self.entries = CacheDirectory(directory, MAGIC, MAX_ROWS * ROW.size, MAX_STORE_BYTES)

    @classmethod
    def default(cls) -> "TableStore":
        return cls(default_directory())

    @property
    def directory(self) -> Path | None:
        return self.entries.directory

    @property
    def stats(self) -> dict[str, int]:
        return {f"stored_{name}": count for name, count in self.entries.stats.items()}

    def load(self, key: StoreKey, identity: FileIdentity | None) -> UnwindFile | None:
        """The table stored under ``key``, or None (not stored, or not a good entry)."""
        entry = self.entries.read(key)
        if entry is None:
            return None
        try:
            found = decode_unwind_file(*entry, identity)
        except (KeyError, TypeError, ValueError, DwarfError):
            self.entries.rejected()
            return None
        self.entries.accepted(key)
        return found

    def save(self, key: StoreKey, unwind: UnwindFile) -> bool:
        """Store ``unwind`` (converted without problems) under ``key``; a failure only costs the entry. True
        when it was stored."""
        if unwind.table.problems or not unwind.table.count:
            return False
        return self.entries.write(key, *encode_unwind_file(unwind))
