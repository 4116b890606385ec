"""The public entry: turns :class:`RawSample` stacks into a shared :class:`Frame` table and
:class:`Sample` rows.

User frames with a build-id are named from the file with that build-id, found in this order: the
index (maps snapshots, exec'd executables and their libraries), a debug file ``<root>/.build-id/..``
(then the frame's dso is the binary's path guessed from the debug root, else ``[build-id <12 hex>]``),
then a one-time scan of the standard library dirs. Frames without a build-id are raw addresses, looked
up in the pid's maps snapshots: file mappings, the [vdso], else JIT code through ``jit_lookup``.

Memory stays bounded for a symbolizer that runs for months (`optrace serve`): the objects with loaded
symbol tables, the named frames, the build-ids not found and the warnings already given are kept for
the most recently used entries only (:class:`CacheLimits`), trimmed at the end of each
:meth:`Symbolizer.symbolize` call, so nothing is dropped while one call runs (a one-shot `record`
symbolizes everything in one call, as if there were no limits).

Not thread-safe: the recorder calls it from one thread.
"""
from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from operator import attrgetter

from optrace.containment import contain
from optrace.credentials import Credentials, run_as
from optrace.errors import OptraceError
from optrace.fileaccess import RefusedFile, may_read
from optrace.model import JIT_MAP, KERNEL, KERNEL_DSO, RUNTIME_FRAME, UNKNOWN, Frame, RawSample, Sample, UserFrame
from optrace.frontend.symbols import debuginfo
from optrace.frontend.symbols.buildid import BuildIdCache, read_build_id
from optrace.frontend.symbols.demangle import demangle
from optrace.frontend.symbols.dso import Dso, DsoContext, FunctionBytes
from optrace.frontend.symbols.srcline import LineRow
from optrace.frontend.symbols.kallsyms import Kallsyms
from optrace.heap import release_free_memory
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.symbols.access import FileRef
from optrace.frontend.symbols.machine import MAX_INDEXED_FILES, Machine
from optrace.frontend.symbols.symbolstore import SymbolStore
from optrace.procfs import MapEntry
from optrace.frontend.symbols.vdso import VDSO, read_own_vdso

READABLE_SECONDS = 10.0  # for one process's checks (a descriptor each: no read, no path walked)

JitLookup = Callable[[int, int, float], "tuple[str, str] | None"]
BUILD_ID = attrgetter("build_id")  # of a UserFrame
RuntimeLookup = Callable[[int, int], Frame]  # (pid, a runtime walker's frame word) -> its frame (frontend/runtimes/)


@dataclass(frozen=True)
class CacheLimits:
    """How many entries each cache keeps past a :meth:`Symbolizer.symbolize` call (least recently used
    go first). Sized for a busy machine: a few hundred programs and libraries in use at once."""

    dsos: int = 512  # objects, each with its symbol table once loaded
    table_bytes: int = 64 << 20  # and at most this much in their symbol tables (a C++ runtime holds 3-15 MB)
    frames: int = 16384  # named (build-id, offset) and kernel frames, each (a miss costs a bisect)
    missing: int = 4096  # build-ids found nowhere
    warnings: int = 4096  # warnings already given (one given again after eviction is harmless)
    indexed_files: int = MAX_INDEXED_FILES  # files (and build-ids) known to the machine index
    interpreters: int = 1024  # runtimes' own files (and their build-ids), told again by each new process


class Symbolizer:
    def __init__(self, kallsyms: Kallsyms | None = None, debug_roots: Sequence[str] = ("/usr/lib/debug",),
                 jit_lookup: JitLookup | None = None, limits: CacheLimits = CacheLimits(),
                 build_ids: BuildIdCache | None = None, scan_slice_s: float | None = None,
                 runtime_lookup: RuntimeLookup | None = None, store: SymbolStore | None = None) -> None:
        """``build_ids``: the cache the sampler's AddressSpaces read mapped files' build-ids through, so
        each mapped file is read once for both. ``scan_slice_s``: how long one :meth:`symbolize` call may
        spend on the scan of the library dirs for an unknown build-id (None: all of it at once); the rest
        comes at later calls. ``store``: objects' tables read in earlier runs, and kept (symbolstore.py)."""
        self.scan_slice_s = scan_slice_s
        self._scan_sliced = False  # this symbolize call had its slice of the scan
        self.warnings: list[str] = []
        # bad_files: files that cost their names (refused, over a budget, malformed), each with one
        # warning; bad_files_<kind> splits them (see access.FileProblems)
        self.stats: dict[str, int] = {"frames_resolved": 0, "frames_unresolved": 0, "dsos_loaded": 0, "bad_files": 0}
        self.machine = Machine(self._warn, self.stats, max_files=limits.indexed_files, build_ids=build_ids)
        self._context = DsoContext(tuple(debug_roots), self._warn, self.stats, store)
        self._kallsyms = kallsyms
        self._kallsyms_loaded = kallsyms is not None
        self._jit_lookup = jit_lookup
        self.runtime_lookup = runtime_lookup  # set once the session knows its runtimes (frontend/runtimes/registry.py)
        self._names_elsewhere: dict[bytes, list[tuple[int, int, str]]] = {}  # see add_names
        self._interpreters: LruCache[bytes | tuple[str, int], None] = LruCache(limits.interpreters)  # add_interpreter
        # Dsos by build-id (bytes) or, for files without a known build-id, by (dev, inode)
        self._dsos: LruCache[bytes | tuple[str, int], Dso] = LruCache(limits.dsos, trim_on_put=False)
        self._missing: LruCache[bytes, int] = LruCache(limits.missing)  # build-id -> index generation when not found
        self._frames: LruCache[tuple[bytes, int], Frame] = LruCache(limits.frames, trim_on_put=False)
        self._kernel_frames: LruCache[int, Frame] = LruCache(limits.frames, trim_on_put=False)
        self._vdso: Dso | None = None
        self._vdso_read = False
        self._warned: LruCache[str, None] = LruCache(limits.warnings)
        self._loaded_at_last_trim = 0
        self._table_bytes = limits.table_bytes

    def add_names(self, build_id: bytes, start: int, end: int, name: str) -> None:
        """Name [start, end) (file offsets) of the object with this build-id: a function found another way
        (a runtime finds one of its own functions in a stripped file), named so before the function
        boundaries of its FDEs would name it file+0xSTART."""
        ranges = self._names_elsewhere.setdefault(build_id, [])
        if (start, end, name) not in ranges:
            ranges.append((start, end, name))

    def add_interpreter(self, build_id: bytes | None, file_key: tuple[str, int]) -> None:
        """The object with this build-id, or the mapped file (device, inode), is a runtime's own (an interpreter):
        its frames are marked ``Frame.interpreter`` (the runtime tells, before its walker sees the process). A
        frame named before is marked when next named (the frame cache checks the mark)."""
        self._interpreters.put(file_key, None)
        if build_id:
            self._interpreters.put(build_id, None)

    def use_kernel_symbols(self, kallsyms: Kallsyms) -> None:
        """Kernel symbols loaded elsewhere (in a thread, while BPF compiles), unless loaded already."""
        if not self._kallsyms_loaded:
            self._kallsyms, self._kallsyms_loaded = kallsyms, True

    def snapshot_process(self, pid: int) -> None:
        self.machine.snapshot_process(pid)

    def add_executable(self, path: str, pid: int | None = None) -> None:
        self.machine.add_executable(path, pid)

    def captured(self, pid: int, entries: Sequence[MapEntry], fds: list[int | None]) -> None:
        """A process's mappings captured with their files open, from any thread (Machine.captured)."""
        self.machine.captured(pid, entries, fds)

    def forget_process(self, pid: int) -> None:
        """Drop what is kept about an exited process (a long-running exporter sees thousands)."""
        self.machine.processes.pop(pid, None)

    def close(self) -> None:
        """Release the files kept open for objects of other mount namespaces, and the store."""
        self.machine.close()
        if self._context.store is not None:
            self._context.store.close()

    def symbolize(self, samples: Iterable[RawSample]) -> tuple[list[Frame], list[Sample]]:
        """Each distinct frame is named once per call: a kernel address, a (pid, user frame), or for a raw
        address a (pid, address, time) (JIT code is named as of its sample's time). A recording at 10k
        samples a second of distinct stacks names 100k stacks of 10 frames from a few hundred frames."""
        self.machine.adopt_captured()
        index: dict[Frame, int] = {}
        resolved: list[bool] = []
        kernel_ids: dict[int, int] = {}
        user_ids: dict[tuple, int] = {}

        def interned(frame: Frame) -> int:
            found = index.get(frame)
            if found is None:
                found = index[frame] = len(resolved)
                resolved.append(frame.resolved)
            return found

        def kernel_stack(stack: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
            ids = []
            for ip in stack:
                found = kernel_ids.get(ip)
                if found is None:
                    found = kernel_ids[ip] = interned(self._kernel_frame(ip))
                ids.append(found)
            return tuple(ids), sum(map(resolved.__getitem__, ids))

        def user_stack(raw: RawSample) -> tuple[tuple[int, ...], int]:
            ids = []
            for frame in raw.user:
                key = (raw.pid, frame) if frame.build_id is not None else (raw.pid, frame, raw.time)
                found = user_ids.get(key)
                if found is None:
                    found = user_ids[key] = interned(self._user_frame(raw, frame))
                ids.append(found)
            return tuple(ids), sum(map(resolved.__getitem__, ids))

        # Whole stacks named once: samples that differ only in thread, command, count or the other half share
        # them (a deep recursion's stacks made this loop's per-frame steps most of a recording's naming).
        kernel_stacks: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}  # -> (frame ids, how many named)
        user_stacks: dict[tuple, tuple[tuple[int, ...], int]] = {}
        rows = []
        named = total = 0
        self._scan_sliced = False
        for raw in samples:
            kernel = kernel_stacks.get(raw.kernel)
            if kernel is None:
                kernel = kernel_stacks[raw.kernel] = kernel_stack(raw.kernel)
            key = (raw.pid, raw.user) if all(map(BUILD_ID, raw.user)) else (raw.pid, raw.user, raw.time)
            user = user_stacks.get(key)
            if user is None:
                user = user_stacks[key] = user_stack(raw)
            ids = kernel[0] + user[0]
            total += len(ids)
            named += kernel[1] + user[1]
            rows.append(Sample(raw.pid, raw.comm, ids, raw.count, raw.tid))
        self.stats["frames_resolved"] += named
        self.stats["frames_unresolved"] += total - named
        self._trim()
        return list(index), rows

    def load_symbols(self, pid: int) -> None:
        """Read now the symbol tables of the objects a snapshotted process maps (a live view of a few
        processes loads them before it attaches, so its first rows come within a second)."""
        maps = self.machine.processes.get(pid)
        for entry in maps.current if maps is not None else ():
            if entry.is_file:
                self._dso_for_mapping(entry).symbol_at(entry.offset)

    def function_code(self, frame: Frame, max_bytes: int) -> FunctionBytes | None:
        """The code of the function a named user frame is in, read from the object with the frame's
        build-id (for `optrace annotate`); None when that object or function cannot be read."""
        if frame.kernel or not frame.resolved or frame.build_id is None:
            return None
        dso = self._dso_for_build_id(bytes.fromhex(frame.build_id))
        return None if dso is None else dso.function_code(frame.address, max_bytes)

    def readable_objects(self, objects: Iterable[tuple[int, str]]) -> set[tuple[int, str]]:
        """Of (pid, build-id) pairs, those whose object file the process's user may read: the kernel's check
        on the very file code is read from, made in a thread holding the credentials the process had at its
        last maps snapshot (optrace.credentials). A program its user may only execute (mode 0711) is not."""
        by_pid: dict[int, set[str]] = {}
        for pid, build_id in objects:
            by_pid.setdefault(pid, set()).add(build_id)
        readable = set()
        for pid, build_ids in by_pid.items():
            user = self.machine.credentials_of(pid)
            if user is not None:
                readable |= {(pid, build_id) for build_id in self._readable_as(user, build_ids)}
        return readable

    def _readable_as(self, user: Credentials, build_ids: Iterable[str]) -> set[str]:
        with ExitStack() as files:
            fds: dict[str, int | None] = {}
            for build_id in build_ids:
                dso = self._dso_for_build_id(bytes.fromhex(build_id))
                try:
                    opened = dso.open_file() if dso is not None else False
                except (OSError, RefusedFile):
                    continue
                if opened is not False:
                    fds[build_id] = None if opened is None else files.enter_context(opened).fd
            try:
                return run_as(user, lambda: {b for b, fd in fds.items() if fd is None or may_read(fd)},
                              READABLE_SECONDS)
            except OSError:  # the credentials could not be taken
                return set()

    def source_lines(self, build_id: str, ranges: Sequence[tuple[int, int]]) -> list[LineRow]:
        """The source lines of these link-time address ranges of the object with this build-id."""
        dso = self._dso_for_build_id(bytes.fromhex(build_id))
        return [] if dso is None else dso.source_lines(ranges)

    def cache_sizes(self) -> dict[str, int]:
        return {"dsos": len(self._dsos), "table_bytes": sum(dso.table_bytes for dso in self._dsos.values()),
                "frames": len(self._frames), "kernel_frames": len(self._kernel_frames),
                "missing": len(self._missing), "warned": len(self._warned), **self.machine.cache_sizes()}

    def _trim(self) -> None:
        """Evict past the limits, between calls only: a Dso in use by a call stays until it ends."""
        self.stats["dsos_evicted"] = self.stats.get("dsos_evicted", 0) + self._dsos.trim() + self._trim_tables()
        self._frames.trim()
        self._kernel_frames.trim()
        self.machine.trim()
        if self.stats["dsos_loaded"] != self._loaded_at_last_trim:  # symbol tables were read: heap to give back
            self._loaded_at_last_trim = self.stats["dsos_loaded"]
            release_free_memory()

    def _trim_tables(self) -> int:
        """Evict least recently used Dsos until their symbol tables fit the byte budget (the most
        recently used one always stays); how many were evicted."""
        total = sum(dso.table_bytes for dso in self._dsos.values())
        evicted = 0
        while total > self._table_bytes and len(self._dsos) > 1:
            total -= self._dsos.evict_oldest().table_bytes
            evicted += 1
        return evicted

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self.warnings.append(message)
        self._warned.put(message, None)

    def _user_frame(self, raw: RawSample, frame: UserFrame) -> Frame:
        if frame.build_id is None:
            return self._address_frame(raw.pid, frame.offset, raw.time)
        if frame.build_id == RUNTIME_FRAME:
            return self._runtime_frame(raw.pid, frame.offset)
        own = self.machine.mapping_of(raw.pid, frame.build_id)
        key = (own.file_key if own is not None else frame.build_id, frame.offset)
        interpreter = key[0] in self._interpreters
        cached = self._frames.get(key)
        if cached is not None and cached.interpreter == interpreter:
            return cached
        dso = self._dso_for_mapping(own) if own is not None else self._dso_for_build_id(frame.build_id)
        if dso is None:
            return Frame(UNKNOWN, UNKNOWN, address=frame.offset, resolved=False, build_id=frame.build_id.hex(),
                         interpreter=interpreter)
        named = self._object_frame(dso, frame.offset, interpreter)
        self._frames.put(key, named)
        return named

    def _address_frame(self, pid: int, address: int, time: float) -> Frame:
        entry = self.machine.mapping_at(pid, address)
        if entry is not None and entry.is_file:
            return self._object_frame(self._dso_for_mapping(entry), entry.file_offset(address),
                                      entry.file_key in self._interpreters)
        if entry is not None and entry.path == VDSO:
            vdso = self._own_vdso()
            offset = entry.file_offset(address)
            if vdso is None:
                return Frame(f"{VDSO}+0x{offset:x}", VDSO, address=offset, resolved=False)
            return self._object_frame(vdso, offset)
        jitted = self._lookup_jit(pid, address, time)
        if jitted is not None:
            symbol, source = jitted
            return Frame(demangle(symbol), f"[jit] {source}", JIT_MAP, address=address)
        return Frame(UNKNOWN, UNKNOWN, address=address, resolved=False)

    def _runtime_frame(self, pid: int, word: int) -> Frame:
        if self.runtime_lookup is None:  # cannot happen: a runtime walker's frames come with a lookup
            return Frame(UNKNOWN, UNKNOWN, address=word, resolved=False)
        return self.runtime_lookup(pid, word)

    def _lookup_jit(self, pid: int, address: int, time: float) -> tuple[str, str] | None:
        if self._jit_lookup is None:
            return None
        lookup = self._jit_lookup  # a broken JIT map must not lose the whole profile
        return contain(lambda: lookup(pid, address, time),
                       lambda err: self._warn(f"JIT symbol lookup failed for pid {pid}: {err}"))

    def _object_frame(self, dso: Dso, offset: int, interpreter: bool = False) -> Frame:
        name = self._name_elsewhere(dso.build_id, offset) or dso.symbol_at(offset)
        build_id = dso.build_id.hex() if dso.build_id else None
        if name is None:
            return Frame(f"{dso.basename}+0x{offset:x}", dso.name, address=offset, resolved=False,
                         build_id=build_id, interpreter=interpreter)
        return Frame(name, dso.name, address=offset, build_id=build_id, interpreter=interpreter)

    def _name_elsewhere(self, build_id: bytes | None, offset: int) -> str | None:
        ranges = self._names_elsewhere.get(build_id) if build_id else None
        if not ranges:  # nearly every object: no generator made per frame named
            return None
        return next((name for start, end, name in ranges if start <= offset < end), None)

    def _dso_for_mapping(self, entry: MapEntry) -> Dso:
        """The object a mapping holds, known by the mapped file (device, inode), not by the build-id it
        claims (see Machine.mapping_of)."""
        ref, build_id = self.machine.files.get(entry.file_key, (FileRef(entry.file_path, entry.file_path), None))
        dso = self._dsos.get(entry.file_key)
        if dso is None and build_id is not None:
            shared = self._dsos.get(build_id)  # loaded for frames of a process gone, from this very file
            dso = shared if shared is not None and shared.source is ref else None
        if dso is None:
            dso = Dso(ref.name, self._context, source=ref, build_id=build_id)
        self._dsos.put(entry.file_key, dso)
        if build_id is not None and self.machine.by_build_id.get(build_id) is ref:
            self._dsos.put(build_id, dso)  # the file that names this build-id for processes gone: one load
        return dso

    def _dso_for_build_id(self, build_id: bytes) -> Dso | None:
        dso = self._dsos.get(build_id)
        if dso is not None:
            return dso
        if self._missing.get(build_id) == self.machine.generation:
            return None
        dso = self._find_dso(build_id)
        if dso is None:
            if self.machine.scan_complete:  # else the scan goes on at the next call: not known missing yet
                self._missing.put(build_id, self.machine.generation)
            return None
        self._dsos.put(build_id, dso)
        return dso

    def _find_dso(self, build_id: bytes) -> Dso | None:
        ref = self.machine.by_build_id.get(build_id)
        if ref is None:
            vdso = self._own_vdso()
            if vdso is not None and vdso.build_id == build_id:
                return vdso
            debug_path = debuginfo.build_id_debug_path(build_id, self._context.debug_roots)
            if debug_path is not None:
                name = debuginfo.original_path(build_id, self._context.debug_roots)
                return Dso(name or f"[build-id {build_id.hex()[:12]}]", self._context,
                           source=FileRef(debug_path, debug_path, follow_symlinks=True), build_id=build_id,
                           debug_only=True)
            if self.scan_slice_s is None or not self._scan_sliced:  # one slice per call, not per frame
                self._scan_sliced = True
                self.machine.scan_standard_dirs(budget_s=self.scan_slice_s)
            ref = self.machine.by_build_id.get(build_id)
        if ref is None:
            return None
        return Dso(ref.name, self._context, source=ref, build_id=build_id)

    def _own_vdso(self) -> Dso | None:
        if not self._vdso_read:
            self._vdso_read = True
            image = read_own_vdso()
            if image is None:
                self._warn("cannot read this process's [vdso]; [vdso] frames show as [vdso]+0xOFFSET")
            else:
                self._vdso = Dso(VDSO, self._context, image=image, build_id=read_build_id(io.BytesIO(image)))
        return self._vdso

    def _kernel_frame(self, ip: int) -> Frame:
        frame = self._kernel_frames.get(ip)
        if frame is None:
            kallsyms = self._kernel_symbols()
            symbol = kallsyms.find(ip) if kallsyms is not None else None
            if symbol is None:
                frame = Frame(f"{KERNEL_DSO}+0x{ip:x}", KERNEL_DSO, KERNEL, address=ip, resolved=False)
            else:
                dso = f"[{symbol.module}]" if symbol.module else KERNEL_DSO
                frame = Frame(demangle(symbol.name), dso, KERNEL, address=ip)
            self._kernel_frames.put(ip, frame)
        return frame

    def _kernel_symbols(self) -> Kallsyms | None:
        if not self._kallsyms_loaded:
            self._kallsyms_loaded = True
            try:
                self._kallsyms = Kallsyms.load()
            except OptraceError as err:
                self._warn(f"{err}; kernel frames show as {KERNEL_DSO}+0xADDRESS")
        return self._kallsyms
