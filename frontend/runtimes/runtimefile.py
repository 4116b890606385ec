"""Facts a runtime's file (an interpreter, libjvm.so) tells of itself, read once per file whatever the number
of processes that map it.

The file is another user's: it is opened as the process maps it (frontend/symbols/access.py's
``open_mapped_file``: /proc/PID/map_files or the path inside the process's root, no symlink followed, a
regular disk file, bounded reads) and handed to the runtime's reader; what it returns (facts, or a short
reason why there are none) is cached by the file's (device, inode, size, mtime).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from optrace.fileaccess import BoundedFile, RefusedFile, printable, reader_for
from optrace.frontend.symbols.access import ELF_POLICY, open_mapped_file
from optrace.frontend.symbols.lru import LruCache
from optrace.procfs import MapEntry

T = TypeVar("T")
FileKey = tuple[int, int, int, int]  # device, inode, size, mtime (ns)
MAX_CACHED_FILES = 256


class RuntimeFiles(Generic[T]):
    """``read(reader, shown, identity)``: the facts of one opened file (``shown``: its printable name;
    ``identity``: its (device, inode, size, mtime), for caches of facts that come with it), or why none."""

    def __init__(self, read: Callable[[BoundedFile, str, FileKey], T | str], max_files: int = MAX_CACHED_FILES) -> None:
        self._read = read
        self._cache: LruCache[FileKey, T | str] = LruCache(max_files)
        self._lock = threading.Lock()

    def facts(self, pid: int, entry: MapEntry) -> T | str:
        """The facts of the file ``pid`` maps at ``entry`` (cached), or why they cannot be had."""
        shown = printable(entry.file_path)
        try:
            fd = open_mapped_file(pid, entry, ELF_POLICY)
        except (RefusedFile, OSError) as err:
            return f"cannot open {shown}: {printable(err)[:200]}"
        if fd is None:
            return "process or mapping gone"
        with reader_for(fd, ELF_POLICY, entry.file_path) as reader:
            info = os.fstat(reader.fd)
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            with self._lock:
                found = self._cache.get(key)
            if found is None:
                found = self._read(reader, shown, key)
                with self._lock:
                    self._cache.put(key, found)
            return found
