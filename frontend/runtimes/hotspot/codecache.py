"""HotSpot's code cache read from the outside: its heaps (``CodeCache::_heaps``: compiled methods, profiled
and non-profiled, and non-method code), and the code blob that holds a pc.

Each heap maps its memory in segments (``1 << _log2_segment_size`` bytes) and keeps a segment map, one byte
per segment: 0 where a block starts, 0xFF for a free segment, else how many segments to step back towards
the block's start. The blob is the block's start plus its HeapBlock header. This is the lookup the VM's own
CodeCache::find_blob does, with a bound on the steps (:data:`MAX_SEGMAP_STEPS`): the map is the process's.

A blob is told by its kind (``CodeBlob::_kind``, JDK 23+) or its name (before): compiled Java methods
("nmethod"), JNI wrappers ("native nmethod"), the template interpreter ("Interpreter"), stubs (the rest).
"""
from __future__ import annotations

from dataclasses import dataclass

from optrace.frontend.runtimes.hotspot.layout import HotSpotLayout
from optrace.frontend.runtimes.hotspot.values import location, value
from optrace.frontend.runtimes.hotspot.vmstructs import Memory

MAX_HEAPS = 8  # JDK 9+ have 3 (segmented) or 1; more is not a code cache
MAX_SEGMAP_STEPS = 64  # each steps back up to 254 segments: 16k segments of 64 bytes, a 1 MiB blob
SEGMAP_WINDOW = 256  # bytes of the segment map read at once
MAX_BLOB_NAME = 64
NMETHOD, NATIVE, INTERPRETER, STUB = "nmethod", "native", "interpreter", "stub"
# JDK 23+ CodeBlobKind names, JDK 9-22 blob names -> kind (a Buffer blob is named: the interpreter's is one)
KIND_NAMES = {"Nmethod": NMETHOD}
BLOB_NAMES = {"nmethod": NMETHOD, "native nmethod": NATIVE, "Interpreter": INTERPRETER}


@dataclass(frozen=True)
class CodeHeap:
    low: int  # its reserved memory [low, high)
    high: int
    segmap: int  # the segment map's first byte
    log2_segment: int


@dataclass(frozen=True)
class CodeBlob:
    address: int
    kind: str  # NMETHOD, NATIVE, INTERPRETER, STUB
    name: str
    code_begin: int
    code_end: int
    frame_size: int  # words, 0 where the blob has no fixed frame (the interpreter)
    frame_complete: int  # offset from code_begin where the frame is built
    header: bytes  # the blob's first bytes (an nmethod's whole header)

    def holds(self, pc: int) -> bool:
        return self.code_begin <= pc < self.code_end


def code_heaps(memory: Memory, layout: HotSpotLayout, bias: int) -> list[CodeHeap] | str:
    """The code cache's heaps now (empty before the VM made them), or why they cannot be read."""
    array = memory.pointer(layout.statics["code_heaps"] + bias)
    if array is None:
        return "CodeCache::_heaps unreadable"
    if not array:
        return []
    header = memory.read_exact(array, 16)
    count, data = value(header, layout.field("array_len")), value(header, layout.field("array_data"))
    if count is None or data is None or not 0 <= count <= MAX_HEAPS:
        return f"bad code heap array ({count} heaps)"
    pointers = memory.read_exact(data, 8 * count) if count else b""
    if pointers is None:
        return "code heap array unreadable"
    heaps = []
    for index in range(count):
        heap = _heap(memory, layout, int.from_bytes(pointers[8 * index:8 * index + 8], "little"))
        if isinstance(heap, str):
            return heap
        heaps.append(heap)
    return heaps


def _heap(memory: Memory, layout: HotSpotLayout, address: int) -> CodeHeap | str:
    fields = [layout.field(name) for name in ("heap_memory", "heap_segmap", "heap_log2_segment_size")]
    size = max(f.offset + f.width for f in fields) + 64
    data = memory.read_exact(address, size)
    if data is None:
        return "code heap unreadable"
    memory_at, segmap_at = layout.field("heap_memory").offset, layout.field("heap_segmap").offset
    low = value(data[memory_at:], layout.field("space_low_boundary"))
    high = value(data[memory_at:], layout.field("space_high_boundary"))
    segmap = value(data[segmap_at:], layout.field("space_low_boundary"))
    log2 = value(data, layout.field("heap_log2_segment_size"))
    if None in (low, high, segmap, log2) or not 4 <= log2 <= 16 or not 0 < low < high:
        return "bad code heap"
    return CodeHeap(low, high, segmap, log2)


def heap_of(heaps: list[CodeHeap], pc: int) -> CodeHeap | None:
    return next((heap for heap in heaps if heap.low <= pc < heap.high), None)


def blob_start(memory: Memory, heap: CodeHeap, pc: int, header_size: int) -> int | None:
    """The address of the blob whose block holds ``pc`` (None: a free segment, or a map that does not end)."""
    segment = (pc - heap.low) >> heap.log2_segment
    for _ in range(MAX_SEGMAP_STEPS):
        first = max(0, segment - SEGMAP_WINDOW + 1)
        window = memory.read_exact(heap.segmap + first, segment - first + 1)
        if window is None:
            return None
        while segment >= first:
            tag = window[segment - first]
            if tag == 0xFF:
                return None
            if tag == 0:
                return heap.low + (segment << heap.log2_segment) + header_size
            segment -= tag
        if segment < 0:
            return None
    return None


def read_blob(memory: Memory, layout: HotSpotLayout, address: int) -> CodeBlob | None:
    """The blob at ``address`` (None when its header cannot be read or makes no sense)."""
    size = max(layout.sizes["nmethod"], layout.sizes["code_blob"])
    header = memory.read_exact(address, size)
    if header is None:
        return None
    begin = location(header, layout.field("blob_code_begin"), address)
    end = location(header, layout.field("blob_code_end"), address)
    frame_size = value(header, layout.field("blob_frame_size"), signed=True)
    complete = value(header, layout.field("blob_frame_complete"), signed=True)
    blob_size = value(header, layout.field("blob_size"), signed=True)
    if None in (begin, end, frame_size, complete, blob_size) or not address < begin <= end <= address + blob_size:
        return None
    name = _name(memory, value(header, layout.field("blob_name")))
    return CodeBlob(address, _kind(layout, header, name), name, begin, end, max(frame_size, 0), complete, header)


def _kind(layout: HotSpotLayout, header: bytes, name: str) -> str:
    if layout.blob_kind is not None:
        kind = KIND_NAMES.get(layout.blob_kinds.get(value(header, layout.blob_kind), ""))
        if kind is not None:
            return NATIVE if name == "native nmethod" else kind
        return INTERPRETER if name == "Interpreter" else STUB
    return BLOB_NAMES.get(name, STUB)


def _name(memory: Memory, pointer: int | None) -> str:
    data = memory.read(pointer, MAX_BLOB_NAME) if pointer else b""
    text = data.split(b"\0", 1)[0].decode("ascii", "replace")
    return "".join(c if c.isprintable() else "?" for c in text) or "[unnamed blob]"
