"""The one cache of unwind tables of a session: each executable file is converted once, however many
processes map it, and the tables held stay under a byte budget.

Keys are the file's identity as the symbol layer keys files (:class:`~optrace.frontend.symbols.buildid.
BuildIdCache`): (st_dev, st_ino, st_size, st_mtime_ns), so a rebuilt or replaced file is converted
again. The build-id (read in the same open, kept with the table) is deliberately not a key: it is a
claim made by the file's owner, and a file forging libc's build-id must not hand its rows to every
process that maps the real libc (the conversion is cheap next to that risk: libc takes 21 ms of CPU).

A file without any CFI of its own (its .eh_frame and .debug_frame stripped) gets the ``.debug_frame`` of
its separate debug file, found by build-id under the debug roots (``/usr/lib/debug/.build-id/xx/rest.debug``,
root's own tree), with the binary's own load segments.

What is kept per file is an :class:`UnwindFile`: the table, the build-id and the PT_LOAD segments, which
turn a mapping's addresses into the file's own virtual addresses (the rows' pcs): see
:meth:`UnwindFile.bias`. The per-process mapping tables of the BPF unwinder take their files from here.

Bound: the rows of the tables held total at most ``max_bytes`` (default DEFAULT_MAX_BYTES = 256 MiB,
about 16 M rows: cc1's table is 7.7 MB), and at most MAX_FILES files are known; the least recently used
go first. A table over the whole budget is returned but not kept.

A daemon need not hold rows the kernel already holds: :meth:`UnwindTableCache.release_rows` drops a
file's rows and keeps what maps it (build-id, load segments); a lookup whose ``need_rows`` says the
kernel lost them (a new generation of bpf/unwindmaps.py) converts the file again.

Conversions run on the cache's builder (:mod:`optrace.frontend.unwind.builder`): in the calling thread, or
(serve) in an unprivileged child process, so a long conversion never competes with the caller's own work.
With a :class:`~optrace.frontend.unwind.tablestore.TableStore` (sessions have one), a table converted in
an earlier run is read back instead, and a new one is stored.

The cache is thread-safe (serve's reload thread and its drain loop may both ask), and two threads asking
for the same file wait for one conversion.

Files are opened only through the symbol layer's hostile-file rules
(:func:`~optrace.frontend.symbols.access.open_mapped_file`, :func:`~optrace.frontend.symbols.access.open_ref`:
no symlink followed, non-blocking, size and time budgets). Whatever a file does wrong (refused,
unreadable, not ELF, malformed or over-budget CFI) costs that file's table: an empty or partial table
and one counted problem through :class:`~optrace.frontend.symbols.access.FileProblems`, never the caller.
"""
from __future__ import annotations

import io
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from optrace.fileaccess import BoundedFile, reader_for
from optrace.frontend.symbols.access import ELF_POLICY, FileProblems, FileRef, open_mapped_file, open_ref
from optrace.frontend.symbols.buildid import FileIdentity
from optrace.frontend.symbols.debuginfo import build_id_debug_path
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.symbols.vdso import VDSO, read_own_vdso
from optrace.frontend.unwind.builder import InProcessBuilder, TableBuilder
from optrace.frontend.symbols.leb128 import DwarfError
from optrace.frontend.unwind.table import EMPTY, UnwindTable
from optrace.frontend.unwind.tablestore import TableStore, store_key
from optrace.frontend.unwind.unwindfile import UnwindFile, convert_file, file_without_rows
from optrace.procfs import MapEntry

DEFAULT_MAX_BYTES = 256 << 20
MAX_FILES = 8192  # files known at once, with rows or released (bpf/unwindmaps.py's MAX_GENERATION_FILES)
CONSEQUENCE = "its frames are walked with frame pointers only"


NO_FILE = UnwindFile(EMPTY)
RELEASED = UnwindTable(b"", 0, "released", 0)  # the table of a file whose rows only the kernel holds now


def rows_always_needed(_identity: FileIdentity) -> bool:
    return True


class UnwindTableCache:
    """Unwind tables by file. ``stats`` counts ``conversions``, ``hits``, ``evictions``, ``too_large`` and
    the problems (``bad_files``, ``bad_files_<kind>``, as the symbolizer's); ``warn`` gets one line per
    bad file."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, warn: Callable[[str], None] | None = None,
                 debug_roots: Sequence[str] = ("/usr/lib/debug",), builder: TableBuilder | None = None,
                 store: TableStore | None = None) -> None:
        self.max_bytes = max_bytes
        self.debug_roots = tuple(debug_roots)
        self.stats: Counter[str] = Counter()
        self._problems = FileProblems(warn or (lambda _line: None), self.stats)
        self._files: LruCache[FileIdentity, UnwindFile] = LruCache(1 << 30, trim_on_put=False)  # bound: bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._building: dict[FileIdentity, threading.Event] = {}
        self.cancelled = threading.Event()  # set when the session ends: builds in progress stop early
        self._vdso: UnwindFile | None = None
        self._builder = builder or InProcessBuilder()
        self.store = store or TableStore(None)
        self._store_keys: OrderedDict[FileIdentity, str] = OrderedDict()  # files whose tables the store holds

    def close(self) -> None:
        """Stop the builder (its child process, if any); lookups after this convert in this process and
        store nothing."""
        self._builder.close()
        self._builder = InProcessBuilder()
        self.store.close()

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._files)

    # -- lookups ----------------------------------------------------------------------------------------
    def of_mapping(self, pid: int, entry: MapEntry) -> UnwindTable:
        return self.file_of_mapping(pid, entry).table

    def of_ref(self, ref: FileRef) -> UnwindTable:
        return self.file_of_ref(ref).table

    def of_open_file(self, fd: int, name: str, build_id: bytes | None = None) -> UnwindTable:
        """``build_id`` is ignored (the file's own is read, see the module's docstring); it is accepted
        because the first version of this cache took it and bpf/'s mapping tables were written against it."""
        return self.file_of_open_file(fd, name).table

    def file_of_mapping(self, pid: int, entry: MapEntry,
                        need_rows: Callable[[FileIdentity], bool] = rows_always_needed) -> UnwindFile:
        """The file ``pid`` maps at ``entry`` (through /proc/PID/map_files: the very inode mapped).
        NO_FILE when the process or mapping is gone or the file is bad (counted). Its table may be
        RELEASED when ``need_rows`` says the rows are not needed."""
        fd = self.open_mapping(pid, entry)
        if fd is None:
            return NO_FILE
        try:
            return self.file_of_open_file(fd, entry.file_path, need_rows)
        finally:
            os.close(fd)

    def open_mapping(self, pid: int, entry: MapEntry) -> int | None:
        """A descriptor of the file ``pid`` maps at ``entry`` (the caller closes it); None when the process or
        mapping is gone or the file is refused (counted)."""
        return self._problems.contained(entry.file_path, CONSEQUENCE, lambda: open_mapped_file(pid, entry, ELF_POLICY))

    def file_without_rows(self, pid: int, entry: MapEntry) -> UnwindFile:
        """The file ``pid`` maps at ``entry``, its build-id and load segments only (not converted, not kept):
        NO_FILE when it is gone or bad (counted)."""
        def read() -> UnwindFile:
            fd = open_mapped_file(pid, entry, ELF_POLICY)
            if fd is None:
                return NO_FILE
            with reader_for(fd, ELF_POLICY, entry.file_path) as reader:
                return file_without_rows(reader, file_identity(fd))
        return self._problems.contained(entry.file_path, CONSEQUENCE, read) or NO_FILE

    def file_of_ref(self, ref: FileRef, need_rows: Callable[[FileIdentity], bool] = rows_always_needed) -> UnwindFile:
        """A file the symbol layer names (a debug file, a library by path)."""
        try:
            reader = open_ref(ref, ELF_POLICY)
        except Exception as err:  # noqa: BLE001 - the per-file boundary
            self._problems.report(ref.name, err, CONSEQUENCE)
            return NO_FILE
        with reader:
            return self._lookup(file_identity(reader.fd), ref.name, reader, need_rows)

    def known(self, identity: FileIdentity, need_rows: Callable[[FileIdentity], bool] = rows_always_needed
              ) -> UnwindFile | None:
        """The file with this identity if it was converted already (and its rows are here, unless ``need_rows``
        says they are not needed), without opening anything; None otherwise."""
        with self._lock:
            found = self._files.get(identity)
            if found is not None and (found.table is not RELEASED or not need_rows(identity)):
                self.stats["hits"] += 1
                return found
        return None

    def file_of_open_file(self, fd: int, name: str,
                          need_rows: Callable[[FileIdentity], bool] = rows_always_needed) -> UnwindFile:
        """The file open at ``fd`` (left open; ``name`` for messages), already checked against
        ELF_POLICY (open_mapped_file, open_file)."""
        with reader_for(os.dup(fd), ELF_POLICY, name) as reader:
            return self._lookup(file_identity(fd), name, reader, need_rows)

    def stored_rows(self, identity: FileIdentity) -> bytes | None:
        """A file's rows without converting it: those held here, else read back from the table store (a file
        whose rows were released or evicted, that a walk of stack copies needs: copies.py); None when neither
        has them."""
        with self._lock:
            found = self._files.get(identity)
            key = self._store_keys.get(identity)
        if found is not None and found.table is not RELEASED and found.table.count:
            return found.table.rows
        if key is None:
            return None
        self.stats["stored_reloads"] += 1
        stored = self.store.load(key, identity)
        return stored.table.rows if stored is not None and stored.table.count else None

    def release_rows(self, identities: Iterable[FileIdentity]) -> int:
        """Drop these files' rows (the kernel holds them now), keeping the rest of what is known of them;
        the bytes dropped."""
        dropped = 0
        with self._lock:
            for identity in identities:
                found = self._files[identity] if identity in self._files else None
                if found is not None and found.table is not RELEASED:
                    dropped += found.table.nbytes
                    self._files.put(identity, replace(found, table=RELEASED))
            self._bytes -= dropped
            self.stats["released_bytes"] += dropped
        return dropped

    def vdso_file(self) -> UnwindFile:
        """The [vdso]'s table, load segments and build-id: the kernel maps the same image into every
        process, so our own copy is read once (its mapping's bias works as a file's: offset 0)."""
        with self._lock:
            if self._vdso is not None:
                return self._vdso
        image = read_own_vdso()
        unwind = None
        if image is not None:
            unwind = self._problems.contained(VDSO, CONSEQUENCE, lambda: convert_file(io.BytesIO(image), None, self.cancelled.is_set))
        with self._lock:
            self._vdso = unwind or NO_FILE
            return self._vdso

    # -- the one conversion per file ------------------------------------------------------------------
    def _lookup(self, identity: FileIdentity, name: str, reader: BoundedFile,
                need_rows: Callable[[FileIdentity], bool] = rows_always_needed) -> UnwindFile:
        while True:
            with self._lock:
                found = self._files.get(identity)
                if found is not None and (found.table is not RELEASED or not need_rows(identity)):
                    self.stats["hits"] += 1
                    return found
                pending = self._building.get(identity)
                if pending is None:
                    pending = self._building[identity] = threading.Event()
                    break
            pending.wait()  # another thread converts this file: use its result
        try:
            unwind = self._problems.contained(name, CONSEQUENCE, lambda: self._converted(reader, identity)) or NO_FILE
            if not unwind.table.count and unwind.build_id is not None:
                unwind = self._from_debug_file(unwind)
            if unwind.table.problems:
                self._problems.report(name, DwarfError(f"{unwind.table.problems} problems in its CFI, first: "
                                                     f"{unwind.table.problem}"), "its unwind table is partial")
            with self._lock:
                unwind = self._store(identity, unwind)
            return unwind
        finally:
            with self._lock:
                del self._building[identity]
            pending.set()

    def _converted(self, reader: BoundedFile, identity: FileIdentity) -> UnwindFile:
        """The file's table as stored by an earlier run, else converted now (and stored)."""
        key = store_key(reader.fd) if self.store.usable else None
        stored = self.store.load(key, identity) if key is not None else None
        if stored is not None:
            self._stored(identity, key)
            return stored
        self.stats["conversions"] += 1
        unwind = self._builder.convert(reader, identity, self.cancelled.is_set)
        if key is not None and self.store.save(key, unwind):
            self._stored(identity, key)
        return unwind

    def _stored(self, identity: FileIdentity, key: str) -> None:
        with self._lock:
            self._store_keys[identity] = key
            self._store_keys.move_to_end(identity)
            if len(self._store_keys) > MAX_FILES:
                self._store_keys.popitem(last=False)

    def _from_debug_file(self, unwind: UnwindFile) -> UnwindFile:
        """``unwind`` with the rows of its separate debug file's .debug_frame, when there is one."""
        path = build_id_debug_path(unwind.build_id, self.debug_roots)
        if path is None:
            return unwind
        self.stats["debug_files"] += 1

        def read() -> UnwindTable:
            with open_ref(FileRef(path, path, follow_symlinks=True), ELF_POLICY) as reader:
                return self._builder.convert(reader, None, self.cancelled.is_set).table
        table = self._problems.contained(path, CONSEQUENCE, read)
        return unwind if table is None else replace(unwind, table=table)

    def _store(self, identity: FileIdentity, unwind: UnwindFile) -> UnwindFile:
        if unwind.table.nbytes > self.max_bytes:
            self.stats["too_large"] += 1
            return unwind
        replaced = self._files[identity] if identity in self._files else None
        self._files.put(identity, unwind)
        self._bytes += unwind.table.nbytes - (replaced.table.nbytes if replaced is not None else 0)
        while self._bytes > self.max_bytes or len(self._files) > MAX_FILES:
            self._bytes -= self._files.evict_oldest().table.nbytes
            self.stats["evictions"] += 1
        return unwind


def file_identity(fd: int) -> FileIdentity:
    """The cache's key of the file open at ``fd``."""
    info = os.fstat(fd)
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


_identity = file_identity  # the name bpf/'s first mapping tables import
