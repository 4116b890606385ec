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

The store is a directory of root's (``/var/cache/optrace/unwind``; ``$XDG_CACHE_HOME/optrace/unwind``
or ``~/.cache/optrace/unwind`` for another user; ``$OPTRACE_CACHE_DIR/unwind`` when that is set, and no
store when it is set empty). It is used only if it is a real directory owned by the user running optrace
that nobody else can write. Entries are opened relative to it without following symlinks or blocking,
must be regular files of that user, at most MAX_ENTRY_BYTES, and carry a SHA-256 of their contents:
anything else is a miss (and the entry is replaced). Only tables converted without a problem are
stored, so a bad file is reported in every run. The store holds at most MAX_STORE_BYTES: the least
recently used entries go first.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import struct
import threading
from pathlib import Path

from optrace import __version__
from optrace.frontend.symbols.buildid import FileIdentity
from optrace.frontend.unwind.cfi import CfiError
from optrace.frontend.unwind.table import MAX_ROWS, ROW
from optrace.frontend.unwind.unwindfile import UnwindFile, decode_unwind_file, encode_unwind_file

MAGIC = b"optrace unwind table 1\n"
MAX_HEADER_BYTES = 1 << 16
MAX_ENTRY_BYTES = len(MAGIC) + 4 + MAX_HEADER_BYTES + MAX_ROWS * ROW.size
MAX_STORE_BYTES = 256 << 20
CACHE_DIR_VARIABLE = "OPTRACE_CACHE_DIR"
_LENGTH = struct.Struct("<I")
# The modules whose code decides a table's rows: a change to any of them is a new fingerprint.
CONVERTER_MODULES = ("cfi", "rules", "row", "table", "unwindfile")

StoreKey = str


def default_directory() -> Path | None:
    """Where this user's tables are stored (None: not at all)."""
    chosen = os.environ.get(CACHE_DIR_VARIABLE)
    if chosen is not None:
        return Path(chosen) / "unwind" if chosen else None
    if os.geteuid() == 0:
        return Path("/var/cache/optrace/unwind")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "optrace" / "unwind"


@functools.cache
def converter_fingerprint() -> str:
    """optrace's version and a SHA-256 of the converter's sources."""
    digest = hashlib.sha256(__version__.encode())
    for name in CONVERTER_MODULES:
        digest.update(Path(__file__).with_name(f"{name}.py").read_bytes())
    return digest.hexdigest()


def store_key(fd: int) -> StoreKey:
    """The entry name of the file open at ``fd``."""
    info = os.fstat(fd)
    identity = [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
    return hashlib.sha256(json.dumps([converter_fingerprint(), identity]).encode()).hexdigest()[:40]


class TableStore:
    """The stored tables of one directory. ``problem`` says why a store is not used (None when it is);
    ``stats`` counts ``stored_hits``, ``stored_misses``, ``stored_writes`` and ``stored_bad`` (entries
    that were not what this module writes)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.problem: str | None = None
        self.stats: dict[str, int] = {"stored_hits": 0, "stored_misses": 0, "stored_writes": 0, "stored_bad": 0}
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._bytes: int | None = None  # what the directory holds, as listed at the last trim and added since
        if directory is not None:
            self._fd = self._open_directory(directory)

    @classmethod
    def default(cls) -> "TableStore":
        return cls(default_directory())

    @property
    def usable(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def load(self, key: StoreKey, identity: FileIdentity | None) -> UnwindFile | None:
        """The table stored under ``key``, or None (not stored, or not a good entry)."""
        if self._fd is None:
            return None
        data = self._read(key)
        found = self._decoded(data, identity) if data is not None else None
        if found is None:
            self.stats["stored_bad" if data is not None else "stored_misses"] += 1
            return None
        self.stats["stored_hits"] += 1
        self._touch(key)
        return found

    def save(self, key: StoreKey, unwind: UnwindFile) -> None:
        """Store ``unwind`` (converted without problems) under ``key``; a failure only costs the entry."""
        if self._fd is None or unwind.table.problems or not unwind.table.count:
            return
        header, rows = encode_unwind_file(unwind)
        header["sha256"] = hashlib.sha256(rows).hexdigest()
        encoded = json.dumps(header).encode()
        if len(encoded) > MAX_HEADER_BYTES:
            return
        temporary = f".new-{os.getpid()}-{threading.get_native_id()}-{key}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self._fd)
            with open(fd, "wb") as out:
                out.write(MAGIC + _LENGTH.pack(len(encoded)) + encoded)
                out.write(rows)
            os.replace(temporary, key, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError:
            self._unlink(temporary)
            return
        self.stats["stored_writes"] += 1
        size = len(MAGIC) + _LENGTH.size + len(encoded) + len(rows)
        with self._lock:  # the directory is listed once, then again only when it may be over its bound
            if self._bytes is None or self._bytes + size > MAX_STORE_BYTES:
                self._bytes = self._trim()
            else:
                self._bytes += size

    # -- the directory and its entries ------------------------------------------------------------------
    def _open_directory(self, directory: Path) -> int | None:
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            self.problem = f"cannot use {directory}: {err.strerror or err}"
            return None
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(fd)
            self.problem = f"{directory} is not used: it must belong to uid {os.geteuid()} and be writable by it alone"
            return None
        return fd

    def _read(self, key: StoreKey) -> bytes | None:
        try:
            fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._fd)
        except OSError:
            return None
        with open(fd, "rb") as entry:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > MAX_ENTRY_BYTES:
                return b""
            return entry.read(MAX_ENTRY_BYTES + 1)

    @staticmethod
    def _decoded(data: bytes, identity: FileIdentity | None) -> UnwindFile | None:
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(data, len(MAGIC))
        start = len(MAGIC) + _LENGTH.size
        try:
            header = json.loads(data[start:start + length])
            rows = data[start + length:]
            if not isinstance(header, dict) or header.pop("sha256", None) != hashlib.sha256(rows).hexdigest():
                return None
            return decode_unwind_file(header, rows, identity)
        except (KeyError, TypeError, ValueError, CfiError):
            return None

    def _touch(self, key: StoreKey) -> None:
        try:
            os.utime(key, dir_fd=self._fd, follow_symlinks=False)
        except OSError:
            pass

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass

    def _trim(self) -> int:
        """Least recently used entries out until the store holds at most MAX_STORE_BYTES; the bytes left
        (other sessions may write meanwhile: a later save lists the directory again)."""
        entries = []
        with os.scandir(self._fd) as listing:
            for item in listing:
                try:
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append((info.st_mtime_ns, info.st_size, item.name))
        total = sum(size for _, size, _ in entries)
        for _, size, name in sorted(entries):
            if total <= MAX_STORE_BYTES:
                break
            self._unlink(name)
            total -= size
        return total
