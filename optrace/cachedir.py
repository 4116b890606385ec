"""A private directory of checksummed entries kept between runs, as perf keeps ~/.debug: the unwind
tables converted from files' CFI (frontend/unwind/tablestore.py), the parsed kernel symbols
(frontend/symbols/kallsyms.py) and the compiled BPF programs (bpf/programcache.py).

Root's entries live in ``/var/cache/optrace/<kind>`` (``$XDG_CACHE_HOME/optrace/<kind>`` or
``~/.cache/optrace/<kind>`` for another user; ``$OPTRACE_CACHE_DIR/<kind>`` when that is set, and
nothing is kept when it is set empty). A directory is used only if it is a real directory owned by the
user running optrace that nobody else can write, reached without following another user's symlink and
through folders no other user may change (optrace.outputdir.open_folder: a link in /tmp would lead root's
writes and least-recently-used deletions into any folder, and another user's folder on the way lets its
owner swap root's directory between runs). Entries are opened relative to it without following
symlinks or blocking, must be regular files of that user of bounded size, and carry a SHA-256 of their
payload: anything else is a miss, and the entry is replaced. New entries are written under a temporary
name and renamed into place; the directory holds at most its byte bound, the least recently used
entries out first (a hit refreshes an entry's mtime).

An entry is MAGIC, a 32-bit little-endian header length, a JSON header (an object) and the payload.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from optrace.outputdir import open_folder

CACHE_DIR_VARIABLE = "OPTRACE_CACHE_DIR"
MAX_HEADER_BYTES = 1 << 16
READING_BYTES = 16 << 20  # of entries being read at once, all directories and threads together (one alone may be more)
_LENGTH = struct.Struct("<I")

Entry = tuple[dict, bytes]  # header (without its checksum), payload


class ByteBudget:
    """At most ``max_bytes`` held at once by the blocks of :meth:`held` (one alone may hold more, when it is
    the only one): a daemon's capture threads and unwind worker each read a table entry at once (python3.11's
    7.3 MB, libLLVM's more), and together they stepped serve's RSS up by 80-90 MB (issue 40). ``waits``
    counts the blocks that waited for their turn."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.waits = 0
        self._held = 0
        self._changed = threading.Condition()

    @contextmanager
    def held(self, size: int) -> Iterator[None]:
        with self._changed:
            if self._held and self._held + size > self.max_bytes:
                self.waits += 1
                self._changed.wait_for(lambda: not self._held or self._held + size <= self.max_bytes)
            self._held += size
        try:
            yield
        finally:
            with self._changed:
                self._held -= size
                self._changed.notify_all()


READING = ByteBudget(READING_BYTES)


def default_directory(kind: str) -> Path | None:
    """Where this user's entries of ``kind`` are kept (None: not at all)."""
    chosen = os.environ.get(CACHE_DIR_VARIABLE)
    if chosen is not None:
        return Path(chosen) / kind if chosen else None
    if os.geteuid() == 0:
        return Path("/var/cache/optrace") / kind
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "optrace" / kind


class CacheDirectory:
    """The entries of one directory. ``problem`` says why it is not used (None when it is); ``stats``
    counts ``hits``, ``misses``, ``writes`` and ``bad`` (entries that were not what this module writes,
    or that their reader rejected)."""

    def __init__(self, directory: Path | None, magic: bytes, max_payload_bytes: int, max_bytes: int) -> None:
        self.directory = directory
        self.magic = magic
        self.max_bytes = max_bytes
        self.max_entry_bytes = len(magic) + _LENGTH.size + MAX_HEADER_BYTES + max_payload_bytes
        self.problem: str | None = None
        self.stats: dict[str, int] = {"hits": 0, "misses": 0, "writes": 0, "bad": 0}
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._bytes: int | None = None  # what the directory holds, as listed at the last trim and added since
        if directory is not None:
            self._fd = self._open_directory(directory)

    @property
    def usable(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, key: str) -> Entry | None:
        """The entry under ``key`` if it is a good one; the caller says :meth:`accepted` or
        :meth:`rejected` once it has decoded it. Its payload is read into a bytes object of its own, once:
        a daemon's threads load tables at once (issue 40), and a whole entry read then sliced held each
        payload twice."""
        if self._fd is None:
            return None
        try:
            fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._fd)
        except OSError:
            self.stats["misses"] += 1
            return None
        with open(fd, "rb", buffering=0) as entry:
            found = self._entry(entry)
        if found is None:
            self.stats["bad"] += 1
        return found

    def accepted(self, key: str) -> None:
        """The entry read under ``key`` was used: a hit, and the most recently used now."""
        self.stats["hits"] += 1
        try:
            os.utime(key, dir_fd=self._fd, follow_symlinks=False)
        except OSError:
            pass

    def names(self) -> list[str]:
        """The entries' names (not those being written)."""
        if self._fd is None:
            return []
        with os.scandir(self._fd) as listing:
            return sorted(item.name for item in listing if not item.name.startswith(".new-"))

    def rejected(self) -> None:
        self.stats["bad"] += 1

    def write(self, key: str, header: dict, payload: bytes) -> bool:
        """Keep ``payload`` under ``key``; a failure only costs the entry. True when it was written."""
        encoded = json.dumps({**header, "sha256": hashlib.sha256(payload).hexdigest()}).encode()
        size = len(self.magic) + _LENGTH.size + len(encoded) + len(payload)
        if self._fd is None or len(encoded) > MAX_HEADER_BYTES or size > self.max_entry_bytes:
            return False
        temporary = f".new-{os.getpid()}-{threading.get_native_id()}-{key}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self._fd)
            with open(fd, "wb") as out:
                out.write(self.magic + _LENGTH.pack(len(encoded)) + encoded)
                out.write(payload)
            os.replace(temporary, key, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError:
            self._unlink(temporary)
            return False
        self.stats["writes"] += 1
        with self._lock:  # the directory is listed once, then again only when it may be over its bound
            if self._bytes is None or self._bytes + size > self.max_bytes:
                self._bytes = self._trim()
            else:
                self._bytes += size
        return True

    # -- the directory and its entries ------------------------------------------------------------------
    def _open_directory(self, directory: Path) -> int | None:
        try:
            walked = open_folder(directory, 0o700)
        except OSError as err:
            self.problem = f"cannot use {directory}: {err.strerror or err}"
            return None
        try:
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=walked)  # O_PATH lists nothing
        except OSError as err:
            self.problem = f"cannot use {directory}: {err.strerror or err}"
            return None
        finally:
            os.close(walked)
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(fd)
            self.problem = f"{directory} is not used: it must belong to uid {os.geteuid()} and be writable by it alone"
            return None
        return fd

    def _entry(self, entry) -> Entry | None:
        """The header and payload of an open entry (unbuffered): None when it is not a good one."""
        info = os.fstat(entry.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > self.max_entry_bytes:
            return None
        with READING.held(info.st_size):
            return self._checked(entry, info)

    def _checked(self, entry, info: os.stat_result) -> Entry | None:
        """:meth:`_entry`'s reads: the magic and header's length, the header, then the payload into its own
        object (the rest of the file, ``info``'s size less the header's)."""
        start = len(self.magic) + _LENGTH.size
        head = _read_exactly(entry, start)
        if head is None or not head.startswith(self.magic):
            return None
        (length,) = _LENGTH.unpack_from(head, len(self.magic))
        encoded = _read_exactly(entry, length) if length <= MAX_HEADER_BYTES else None
        size = info.st_size - start - length
        payload = _read_exactly(entry, size) if encoded is not None and size >= 0 else None
        if payload is None or entry.read(1):
            return None
        try:
            header = json.loads(encoded)
        except (ValueError, RecursionError):  # RecursionError: a header of nested brackets
            return None
        if not isinstance(header, dict) or header.pop("sha256", None) != hashlib.sha256(payload).hexdigest():
            return None
        return header, payload

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass

    def _trim(self) -> int:
        """Least recently used entries out until the directory holds at most ``max_bytes``; the bytes left
        (other sessions may write meanwhile: a later write lists the directory again)."""
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
            if total <= self.max_bytes:
                break
            self._unlink(name)
            total -= size
        return total


def _read_exactly(stream, size: int) -> bytes | None:
    """``size`` bytes of an unbuffered file, read into one object (a short read grows nothing: None)."""
    data = stream.read(size)
    while data is not None and len(data) < size:
        more = stream.read(size - len(data))
        if not more:
            return None
        data += more
    return data


class EntryStore:
    """What a store kept in a :class:`CacheDirectory` (``entries``) says of itself; subclasses read and write."""

    entries: CacheDirectory

    @property
    def problem(self) -> str | None:
        return self.entries.problem

    @property
    def usable(self) -> bool:
        return self.entries.usable

    def close(self) -> None:
        self.entries.close()
