"""One HotSpot JVM read from the outside: found by its libjvm.so, its tables read once per libjvm (and per
user: the tables are read from a process's memory, which its owner controls, so one user's faked tables never
name another user's frames), then its frames named on demand: interpreted frames by Method* and bci,
compiled frames by their nmethod and pc with the methods inlined there expanded, stubs by name.

Names are cached per Method* (bounded): a method's name does not change while it lives, and a Method* that
is freed and reused is caught by the cookie the walker keeps with the frame (the ConstMethod for interpreted
frames, the compile id for compiled ones: :meth:`HotSpotProcess.still`). Every reason a frame could not be
named is counted in :attr:`HotSpotProcess.outcomes`.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from optrace.frontend.runtimes.hotspot.codecache import (INTERPRETER, NATIVE, NMETHOD, CodeBlob, CodeHeap, blob_start,
                                                         code_heaps, heap_of, read_blob)
from optrace.frontend.runtimes.hotspot.jvmfile import jvm_file, libjvm_mapping
from optrace.frontend.runtimes.hotspot.layout import HotSpotLayout, hotspot_layout, unsigned5_excluded
from optrace.frontend.runtimes.hotspot.methods import POOL_LENGTH_AT, JavaMethod, MethodReader
from optrace.frontend.runtimes.hotspot.scopes import DebugInfo, debug_info, scopes_at
from optrace.frontend.runtimes.hotspot.values import value
from optrace.frontend.runtimes.hotspot.vmstructs import Memory, VMStructs, read_vmstructs
from optrace.frontend.symbols.lru import LruCache
from optrace.procfs import MapEntry, process_uid

MAX_METHODS = 16384  # names kept per process
MAX_DEBUG_BYTES = 16 << 20  # compiled methods' debug information kept per process (bytes)
MAX_TABLES = 64  # (libjvm, user) readings kept
MAX_VERSION = 128

_tables: LruCache[tuple, tuple[VMStructs, int]] = LruCache(MAX_TABLES)
_tables_lock = threading.Lock()


@dataclass(frozen=True)
class JavaFrame:
    kind: str  # "interpreted", "compiled", "inlined", "native" (a JNI wrapper), "stub"
    name: str  # "java.util.TimSort.binarySort", or a stub's name
    file: str = ""
    line: int = 0
    bci: int = -1
    signature: str = ""  # the method's, as the class file spells it: "(II)I"

    def __str__(self) -> str:
        where = f" ({self.file}:{self.line})" if self.file and self.line else ""
        return f"{self.name}{where} [{self.kind}]"


class HotSpotProcess:
    def __init__(self, pid: int, memory: Memory, bias: int, structs: VMStructs, layout: HotSpotLayout,
                 major: int, release: str) -> None:
        self.pid = pid
        self.memory = memory
        self.structs = structs
        self.bias = bias
        self.layout = layout
        self.major = major
        self.release = release
        self.excluded = unsigned5_excluded(major)
        self.outcomes: Counter[str] = Counter()
        self._methods = MethodReader(memory, layout, self.excluded, structs.offsets.get(POOL_LENGTH_AT))
        self._names: LruCache[int, JavaMethod | str] = LruCache(MAX_METHODS)
        self._debug: LruCache[tuple[int, int], DebugInfo | str] = LruCache(MAX_DEBUG_BYTES, trim_on_put=False)
        self._debug_bytes = 0
        self._heaps: list[CodeHeap] = []

    def heaps(self, refresh: bool = False) -> list[CodeHeap]:
        if refresh or not self._heaps:
            found = code_heaps(self.memory, self.layout, self.bias)
            self._heaps = found if isinstance(found, list) else []
            if isinstance(found, str):
                self.outcomes[found] += 1
        return self._heaps

    def in_code_cache(self, pc: int) -> bool:
        return heap_of(self.heaps(), pc) is not None

    def blob_at(self, pc: int) -> CodeBlob | None:
        heap = heap_of(self.heaps(), pc)
        start = blob_start(self.memory, heap, pc, self.layout.sizes["heap_block"]) if heap else None
        blob = read_blob(self.memory, self.layout, start) if start else None
        if heap and (blob is None or not blob.holds(pc)):
            self.outcomes["no code blob at pc"] += 1
            return None
        return blob

    def method(self, address: int) -> JavaMethod | str:
        found = self._names.get(address)
        if found is None:
            found = self._methods.method(address)
            self._names.put(address, found)
        return found

    def interpreted(self, method: int, bci: int) -> JavaFrame:
        return self._frame("interpreted", method, bci)

    def compiled(self, blob: CodeBlob, pc: int, return_address: bool) -> list[JavaFrame]:
        """The frames of compiled code at ``pc`` in ``blob``, innermost first: the methods inlined there, then
        the nmethod's own; a JNI wrapper is its native method; a stub is its name."""
        if blob.kind not in (NMETHOD, NATIVE):
            return [JavaFrame("stub", blob.name if blob.kind != INTERPRETER else "Interpreter")]
        method = value(blob.header, self.layout.field("nmethod_method"))
        if blob.kind == NATIVE or not method:
            return [self._frame("native" if blob.kind == NATIVE else "compiled", method or 0, -1)]
        info = self._debug_info(blob)
        scopes = scopes_at(info, pc - blob.code_begin, return_address, self.excluded) if not isinstance(info, str) \
            else info
        if isinstance(scopes, str) or not scopes:
            self.outcomes[scopes if isinstance(scopes, str) else "no scope at pc"] += 1
            return [self._frame("compiled", method, -1)]
        if scopes[-1].method != method:  # the VM never writes this: stale or forged debug information
            self.outcomes["outermost scope is not the nmethod's method"] += 1
            return [self._frame("compiled", method, -1)]
        return [self._frame("inlined" if i < len(scopes) - 1 else "compiled", s.method, s.bci)
                for i, s in enumerate(scopes)]

    def _debug_info(self, blob: CodeBlob) -> DebugInfo | str:
        key = (blob.address, value(blob.header, self.layout.field("nmethod_compile_id")) or 0)
        found = self._debug.get(key)
        if found is None:
            found = debug_info(self.memory, self.layout, blob)
            self._debug.put(key, found)
            self._debug_bytes += _size(found)
            while self._debug_bytes > MAX_DEBUG_BYTES and len(self._debug) > 1:
                self._debug_bytes -= _size(self._debug.evict_oldest())
        return found

    def _frame(self, kind: str, method: int, bci: int) -> JavaFrame:
        found = self.method(method) if method else "no Method"
        if isinstance(found, str):
            self.outcomes[found] += 1
            return JavaFrame(kind, "[unknown Java method]", bci=bci)
        self.outcomes["named"] += 1
        return JavaFrame(kind, found.qualified, found.source, found.line(bci) if bci >= 0 else 0, bci, found.signature)


def _size(info: DebugInfo | str) -> int:
    return len(info) if isinstance(info, str) else len(info.metadata) + len(info.scopes) + 16 * len(info.pcs)


def attach(pid: int, entries: list[MapEntry], memory: Memory) -> HotSpotProcess | str:
    """The JVM of process ``pid`` (``entries``: its mappings), or why there is none to name."""
    entry = libjvm_mapping(entries)
    if entry is None:
        return "no libjvm.so mapped"
    jvm = jvm_file(pid, entry)
    if isinstance(jvm, str):
        return jvm
    return attach_tables(pid, memory, jvm.symbols, jvm.bias(entry), (jvm.identity, process_uid(pid)))


def attach_tables(pid: int, memory: Memory, symbols: dict[str, int], bias: int, key: tuple) -> HotSpotProcess | str:
    """The JVM whose libjvm has ``symbols`` at load ``bias``; its tables are read once per ``key`` (the file
    and the process's user)."""
    with _tables_lock:
        found = _tables.get(key)
    if found is None:
        found = _read_tables(memory, symbols, bias)
        if isinstance(found, str):
            return found  # not cached: a VM still starting (its tables are set up at start), or gone
        with _tables_lock:
            _tables.put(key, found)
    structs, major = found
    layout = hotspot_layout(structs, major)
    if isinstance(layout, str):
        return layout
    return HotSpotProcess(pid, memory, bias, structs, layout, major, _release(memory, structs, bias))


def _read_tables(memory: Memory, symbols: dict[str, int], bias: int) -> tuple[VMStructs, int] | str:
    structs = read_vmstructs(memory, symbols, bias)
    if isinstance(structs, str):
        return structs
    at = structs.addresses.get("Abstract_VM_Version::_vm_major_version")
    data = memory.read_exact(at + bias, 4) if at is not None else None
    if data is None:
        return "Abstract_VM_Version::_vm_major_version unreadable"
    return structs, int.from_bytes(data, "little")


def _release(memory: Memory, structs: VMStructs, bias: int) -> str:
    at = structs.addresses.get("Abstract_VM_Version::_s_vm_release")
    pointer = memory.pointer(at + bias) if at is not None else None
    text = memory.read(pointer, MAX_VERSION).split(b"\0", 1)[0] if pointer else b""
    return "".join(c if c.isprintable() else "?" for c in text.decode("ascii", "replace"))
