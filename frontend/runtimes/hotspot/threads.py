"""A JVM's Java threads read from the outside: the list the VM keeps (``ThreadsSMRSupport::_java_thread_list``),
each thread's kernel tid (its OSThread's), and the last Java frame a thread left when it went into the VM or
native code (its JavaFrameAnchor: how the VM itself walks a thread that is not running Java code), also below
an entry frame where the VM called Java again (a JavaCallWrapper's anchor). Bounded: at most MAX_THREADS
threads are looked at."""
from __future__ import annotations

from dataclasses import dataclass

from optrace.frontend.runtimes.hotspot.layout import HotSpotLayout
from optrace.frontend.runtimes.hotspot.values import value
from optrace.frontend.runtimes.hotspot.vmstructs import Memory

MAX_THREADS = 16384


@dataclass(frozen=True)
class Anchor:
    sp: int
    pc: int  # 0: the return address is the word below sp
    fp: int


def java_thread(memory: Memory, layout: HotSpotLayout, bias: int, tid: int) -> int | None:
    """The JavaThread* of kernel thread ``tid`` (None: not a Java thread, or unreadable)."""
    threads_list = memory.pointer(layout.statics["java_threads"] + bias)
    header = memory.read_exact(threads_list, 24) if threads_list else None
    count = value(header, layout.field("threads_length"))
    array = value(header, layout.field("threads_array"))
    if not count or not array or count > MAX_THREADS:
        return None
    pointers = memory.read_exact(array, 8 * count)
    if pointers is None:
        return None
    osthread_at, tid_at = layout.field("thread_osthread").offset, layout.field("osthread_tid").offset
    for index in range(count):
        thread = int.from_bytes(pointers[8 * index:8 * index + 8], "little")
        osthread = memory.pointer(thread + osthread_at) if thread else None
        found = memory.read_exact(osthread + tid_at, 4) if osthread else None
        if found is not None and int.from_bytes(found, "little") == tid:
            return thread
    return None


def last_java_frame(memory: Memory, layout: HotSpotLayout, thread: int) -> Anchor | None:
    """The thread's anchor, None when it is running Java code (no anchor set) or unreadable."""
    return anchor_at(memory, layout, thread + layout.field("thread_anchor").offset)


def caller_java_frame(memory: Memory, layout: HotSpotLayout, entry_fp: int) -> Anchor | None:
    """Below an entry frame (the call stub, at frame pointer ``entry_fp``), the last Java frame of the Java
    code that called into the VM which called Java again (its JavaCallWrapper's anchor); None at the thread's
    first entry into Java (no Java frame below) or when unreadable."""
    wrapper = memory.pointer(entry_fp + 8 * layout.ints["entry_frame_call_wrapper"])
    return anchor_at(memory, layout, wrapper + layout.field("call_wrapper_anchor").offset) if wrapper else None


def anchor_at(memory: Memory, layout: HotSpotLayout, at: int) -> Anchor | None:
    data = memory.read_exact(at, 24)
    sp, pc, fp = (value(data, layout.field(name)) for name in ("anchor_sp", "anchor_pc", "anchor_fp"))
    if not sp or pc is None or fp is None:
        return None
    return Anchor(sp, pc, fp)
