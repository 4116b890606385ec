"""Facts a mapped x86_64 ELF file tells of itself (an interpreter, libjvm.so: where their structures are
linked), read once per file whatever the number of processes that map it.

The file is another user's: it is opened as the process maps it (access.py's ``open_mapped_file``:
/proc/PID/map_files or the path inside the process's root, no symlink followed, a regular disk file, bounded
reads), read with the project's bounded ELF reader and handed to the caller's reader; what it returns (facts,
or a short reason why there are none) is cached by the file's (device, inode, size, mtime). A file that is not
x86_64 ELF, or whose reading fails, is a reason too.
"""
from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from optrace.fileaccess import BoundedFile, RefusedFile, printable, reader_for
from optrace.frontend.symbols.access import ELF_POLICY, open_mapped_file
from optrace.frontend.symbols.elffile import EM_X86_64, ElfFile
from optrace.frontend.symbols.lru import LruCache
from optrace.procfs import MapEntry

T = TypeVar("T")
FileKey = tuple[int, int, int, int]  # device, inode, size, mtime (ns)
MAX_CACHED_FILES = 256


class FileFacts(Generic[T]):
    """``read(elf, reader, shown, identity)``: the facts of one opened file (``shown``: its printable name;
    ``identity``: its (device, inode, size, mtime), for caches of facts that come with it), or why none."""

    def __init__(self, read: Callable[[ElfFile, BoundedFile, str, FileKey], T | str],
                 max_files: int = MAX_CACHED_FILES) -> None:
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
                found = self._elf_facts(reader, shown, key)
                with self._lock:
                    self._cache.put(key, found)
            return found

    def _elf_facts(self, reader: BoundedFile, shown: str, key: FileKey) -> T | str:
        try:
            elf = ElfFile(reader)
            if elf.elfclass != 64 or not elf.little_endian or elf.machine != EM_X86_64:
                return f"{shown} is not an x86_64 ELF file"
            return self._read(elf, reader, shown, key)
        except (OSError, ValueError, struct.error) as err:  # ElfFormatError and BudgetExceeded included
            return f"cannot read {shown}: {printable(err)[:200]}"
