"""A user-space reference walk of one stopped thread's Java frames, from its registers: the rules the BPF
walker will follow (docs/runtimes.md), used by tests to prove the naming on live JVMs.

From a pc in the code cache the frames are the VM's own: an interpreted frame is found from its frame pointer
(Method* and bytecode pointer in fixed slots; the leaf's current bytecode pointer is in r13, when r13 points
into the method's bytecodes: elsewhere in the interpreter, the slot's saved one), a compiled frame or
stub from its blob's fixed frame size (the return address and saved rbp at its top). The walk ends at the
call stub's return address when it is the thread's first entry into Java (at an upcall, where the VM called
Java from a runtime call of Java code, the walk goes on below, from the Java frame the call wrapper recorded),
at a pc outside the code cache, or after MAX_FRAMES frames. A thread stopped outside the code cache (in the
VM or native code) is walked from the last Java frame it left (threads.py), as the VM does.

Compiled code's prologue and epilogue have no complete frame, and some stubs no fixed one: a leaf's caller is
read in the ways such a frame can be laid out (see ``_compiled_callers``), the first that returns into code the
walk knows being taken; a caller's frame is always complete.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from optrace.frontend.runtimes.hotspot.codecache import INTERPRETER, CodeBlob
from optrace.frontend.runtimes.hotspot.process import HotSpotProcess, JavaFrame
from optrace.frontend.runtimes.hotspot.threads import caller_java_frame, java_thread, last_java_frame
from optrace.frontend.runtimes.hotspot.values import value
from optrace.frontend.runtimes.hotspot.vmstructs import Memory

MAX_FRAMES = 512
MAX_LEAF_FRAME = 1 << 16  # bytes between a leaf's sp and an rbp it may have pushed a frame at
RET = 0xC3
WORD = 8
ENTRY = "entry"  # reached the call stub: the thread's Java frames are all there
NOT_JAVA = "not in Java"  # stopped outside the code cache with no last Java frame
LEFT_CODE_CACHE = "left the code cache"
UNREADABLE = "unreadable"
NO_BLOB = "no code blob"
DEPTH = "depth"


@dataclass(frozen=True)
class Registers:
    ip: int
    sp: int
    bp: int
    r13: int  # the interpreter's bytecode pointer register (x86_64)


@dataclass(frozen=True)
class JavaStack:
    frames: tuple[JavaFrame, ...]  # innermost first
    status: str
    from_anchor: bool = False  # walked from the last Java frame the thread left (it was in the VM or native code)
    upcalls: int = 0  # entry frames walked through (the VM called Java from a runtime call of Java code)


def java_stack(process: HotSpotProcess, regs: Registers, tid: int) -> JavaStack:
    pc, sp, fp, leaf = regs.ip, regs.sp, regs.bp, True
    from_anchor = not process.in_code_cache(pc)
    if from_anchor:
        thread = java_thread(process.memory, process.layout, process.bias, tid)
        anchor = last_java_frame(process.memory, process.layout, thread) if thread else None
        if anchor is None:
            return JavaStack((), NOT_JAVA)
        sp, fp, leaf = anchor.sp, anchor.fp, False
        pc = anchor.pc or process.memory.pointer(sp - WORD) or 0
    frames: list[JavaFrame] = []
    upcalls = 0
    call_stub = process.memory.pointer(process.layout.statics["call_stub_return"] + process.bias) or 0
    for _ in range(MAX_FRAMES):
        if not leaf and pc == call_stub:  # an entry frame: the thread's first, or an upcall from the VM
            below = caller_java_frame(process.memory, process.layout, fp)
            if below is None:
                return JavaStack(tuple(frames), ENTRY, from_anchor, upcalls)
            pc, sp, fp = below.pc or process.memory.pointer(below.sp - WORD) or 0, below.sp, below.fp
            upcalls += 1
            continue
        step = _frame(process, pc, sp, fp, regs.r13 if leaf else None, call_stub, frames)
        if isinstance(step, str):
            return JavaStack(tuple(frames), step, from_anchor, upcalls)
        pc, sp, fp = step
        leaf = False
    return JavaStack(tuple(frames), DEPTH, from_anchor, upcalls)


def _frame(process: HotSpotProcess, pc: int, sp: int, fp: int, bcp_register: int | None, call_stub: int,
           frames: list[JavaFrame]) -> tuple[int, int, int] | str:
    """Names the frame at ``pc`` into ``frames``; its caller's (pc, sp, fp), or why the walk ends."""
    if not process.in_code_cache(pc):
        return LEFT_CODE_CACHE
    blob = process.blob_at(pc)
    if blob is None:
        return NO_BLOB
    memory = process.memory
    if blob.kind == INTERPRETER:
        slots = process.layout.interpreter_frame
        method = memory.pointer(fp + WORD * slots["method"])
        saved_bcp = memory.pointer(fp + WORD * slots["bcp"])
        caller = memory.read_exact(fp - WORD, 3 * WORD)  # sender sp, saved fp, return address
        if method is None or saved_bcp is None or caller is None:
            return UNREADABLE
        bci = _bci(process, method, bcp_register) if bcp_register is not None else -1
        frames.append(process.interpreted(method, bci if bci >= 0 else _bci(process, method, saved_bcp)))
        sender_sp, saved_fp, ra = (int.from_bytes(caller[i:i + WORD], "little") for i in (0, WORD, 2 * WORD))
        return ra, sender_sp, saved_fp
    frames.extend(process.compiled(blob, pc, return_address=bcp_register is None))
    callers = _compiled_callers(process, blob, (pc, sp, fp), call_stub, leaf=bcp_register is not None)
    return next(callers, UNREADABLE)


def _compiled_callers(process: HotSpotProcess, blob: CodeBlob, regs: tuple[int, int, int], call_stub: int,
                      leaf: bool) -> Iterator[tuple[int, int, int]]:
    """The caller's (pc, sp, fp) of a compiled frame or stub. A caller's frame is complete: its blob's frame
    size places the return address and the saved rbp. A leaf may be in a prologue or epilogue, or a stub with
    no fixed frame: the frame-size reading first (a pc before the frame is complete or on a ``ret``: with only
    the return address pushed first), then with the return address at sp, at sp + 8 (rbp pushed), above rbp
    (an rbp frame); the first that returns right after a call in the code cache (or to the call stub)."""
    memory = process.memory
    pc, sp, fp = regs
    size = blob.frame_size * WORD
    built = _caller_at(memory, sp + size - 2 * WORD, sp + size) if size >= 2 * WORD else None
    readings = [built]
    if leaf:
        frameless = (memory.pointer(sp), sp + WORD, fp)
        pushed = _caller_at(memory, sp, sp + 2 * WORD)
        framed = _caller_at(memory, fp, fp + 2 * WORD) if sp <= fp < sp + MAX_LEAF_FRAME else None
        readings = [frameless, pushed, built, framed] if _frameless(process, blob, pc) else \
            [built, frameless, pushed, framed]
    for reading in readings:
        if reading is not None and reading[0] is not None and (reading[0] == call_stub or not leaf
                                                               or _returns_into_code(process, reading[0])):
            yield reading


def _returns_into_code(process: HotSpotProcess, address: int) -> bool:
    """Whether ``address`` can be a return address: in the interpreter (whose invokes push the return entry of
    the bytecode and jump), else right after a call instruction in the code cache; a value that merely points
    into code (a spilled address) is not taken for one."""
    if not process.in_code_cache(address):
        return False
    blob = process.blob_at(address)
    if blob is not None and blob.kind == INTERPRETER:
        return True
    before = process.memory.read_exact(address - 8, 8)
    return before is not None and (before[3] == 0xE8 or any(_indirect_call(before, size) for size in range(2, 8)))


def _indirect_call(before: bytes, size: int) -> bool:
    """Whether the ``size`` bytes ending ``before`` are ``call r/m64`` (FF /2, maybe after a REX prefix)."""
    at = len(before) - size
    if 0x40 <= before[at] <= 0x4F:
        at += 1
    if at + 2 > len(before) or before[at] != 0xFF or (before[at + 1] >> 3) & 7 != 2:
        return False
    modrm = before[at + 1]
    mod, rm = modrm >> 6, modrm & 7
    length = 2
    if mod != 3 and rm == 4:  # a SIB byte follows
        length += 1
        if mod == 0 and at + 2 < len(before) and before[at + 2] & 7 == 5:
            length += 4
    length += {1: 1, 2: 4}.get(mod, 4 if mod == 0 and rm == 5 else 0)
    return at + length == len(before)


def _caller_at(memory: Memory, saved_fp_at: int, caller_sp: int) -> tuple[int, int, int] | None:
    """(return address, caller's sp, caller's fp) with the saved rbp at ``saved_fp_at`` and the return address
    just above it."""
    top = memory.read_exact(saved_fp_at, 2 * WORD)
    if top is None:
        return None
    return int.from_bytes(top[WORD:], "little"), caller_sp, int.from_bytes(top[:WORD], "little")


def _frameless(process: HotSpotProcess, blob: CodeBlob, pc: int) -> bool:
    """A leaf pc whose frame is not built (the prologue) or already gone (on the ``ret``)."""
    if pc < blob.code_begin + blob.frame_complete:
        return True
    code = process.memory.read_exact(pc, 1)
    return code is not None and code[0] == RET


def _bci(process: HotSpotProcess, method: int, bcp: int) -> int:
    """The bytecode index of a bytecode pointer (-1: not inside the method's bytecodes). Bounded by the
    method's own code size: r13 may point into another method's bytecodes while the frame at rbp is still
    the caller's (returning from a callee, before the caller's bcp is restored; JDK 17 gave Phases.hashPhase,
    48 bytes of code, bci 246: the next method's ``lreturn``)."""
    layout = process.layout
    const_method = process.memory.pointer(method + layout.field("method_const_method").offset)
    header = process.memory.read_exact(const_method, layout.sizes["const_method"]) if const_method else None
    code_size = value(header, layout.field("const_method_code_size"))
    if header is None or code_size is None:
        return -1
    first = const_method + layout.sizes["const_method"]
    return bcp - first if 0 <= bcp - first < code_size else -1
