"""A user-space reference walker of a thread's Python frames, reading exactly what the BPF walker
(bpf/python.c) reads: ``_PyRuntime.interpreters.head``, that interpreter's thread states (``tstate.next``),
the thread's current frame (through ``cframe`` on 3.11/3.12) and the ``previous`` links, a FRAME_WINDOW
read per frame, giving the same (code object, instruction) pairs as the walker's frame words. Tests use it
to check a layout against a real interpreter; ``doctor`` can use it to show a process's stacks.

Choosing the thread: the BPF walker matches ``tstate.thread_id`` (pthread_self) with the sampled thread's
fs base, which user space cannot read without ptrace (PTRACE_ARCH_PRCTL stops the thread). So here a
thread is named by its kernel tid, matched with ``native_thread_id`` (3.11+, :func:`thread_stack`), or by
its pthread id (``threading.get_ident()`` in the process: pthread_self on Linux), matched with
``thread_id`` as the BPF walker does (every version).

The process's memory is its own: at most :data:`MAX_THREADS` thread states and :data:`MAX_FRAMES` frames
are followed, a link seen before ends the walk (a loop), and an unreadable frame ends it too; each such
stop is said in :attr:`ThreadStack.truncated`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from optrace.frontend.runtimes.cpython.codeobject import CodeInfo, read_code
from optrace.frontend.runtimes.cpython.interpreter import thread_offsets
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.pythonlayout import (ENTRY_FLAG, ENTRY_PER_CALL, ENTRY_SHIM, FRAME_WINDOW, INSTR_LASTI_BYTES,
                                  INSTR_POINTER, PythonLayout, PythonProcess, python_frame_parts, python_frame_word)

MAX_FRAMES = 1024  # frames followed per thread
MAX_THREADS = 4096  # thread states followed per interpreter
_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")


@dataclass(frozen=True)
class ThreadState:
    address: int
    thread_id: int  # pthread_self() of the thread
    native_thread_id: int | None  # its kernel tid (3.11+)


@dataclass(frozen=True)
class PyFrame:
    code: int  # the code object's address (as the frame word keeps it)
    instr: int  # instruction index in code units (as the frame word keeps it)
    entry: bool  # the first frame its native eval call ran (the boundary with the native frame below)
    info: CodeInfo | None  # None when the code object could not be read

    @property
    def line(self) -> int:
        return self.info.line(self.instr) if self.info else 0


@dataclass(frozen=True)
class ThreadStack:
    tstate: int
    frames: tuple[PyFrame, ...]  # innermost first
    truncated: str | None = None  # why the walk stopped early ("loop", "depth", "unreadable frame")


def thread_states(process: PythonProcess, memory: ProcessMemory | None = None) -> list[ThreadState]:
    """The thread states of the process's first interpreter (newest first), as far as they can be read."""
    memory = memory or ProcessMemory(process.pid)
    layout, threads = process.layout, thread_offsets(process, memory)
    interp = memory.pointer(process.runtime + layout.interpreters_head)
    tstate = memory.pointer(interp + layout.interp_threads_head) if interp else None
    found: list[ThreadState] = []
    seen: set[int] = set()
    while tstate and tstate not in seen and len(found) < MAX_THREADS:
        seen.add(tstate)
        thread_id = memory.pointer(tstate + layout.tstate_thread_id)
        if thread_id is None:
            break
        native = None
        if threads is not None and threads.tstate_native_thread_id >= 0:
            native = memory.pointer(tstate + threads.tstate_native_thread_id)
        found.append(ThreadState(tstate, thread_id, native))
        tstate = memory.pointer(tstate + layout.tstate_next)
    return found


def thread_stack(process: PythonProcess, *, tid: int | None = None, pthread_id: int | None = None,
                 names: bool = True) -> ThreadStack | None:
    """The Python stack of the thread with kernel tid ``tid`` (3.11+) or pthread id ``pthread_id``; None
    when no thread state matches."""
    memory = ProcessMemory(process.pid)
    for state in thread_states(process, memory):
        if (tid is not None and state.native_thread_id == tid) or (pthread_id is not None
                                                                     and state.thread_id == pthread_id):
            return walk_frames(process, state.address, memory, names)
    return None


def walk_frames(process: PythonProcess, tstate: int, memory: ProcessMemory, names: bool = True) -> ThreadStack:
    """The frames of the thread state at ``tstate``, innermost first (names read when ``names``)."""
    layout = process.layout
    frame = _current_frame(memory, layout, tstate)
    frames: list[PyFrame] = []
    seen: set[int] = set()
    infos: dict[int, CodeInfo | None] = {}
    for _ in range(MAX_FRAMES):
        if not frame:
            return ThreadStack(tstate, tuple(frames))
        if frame in seen:
            return ThreadStack(tstate, tuple(frames), "loop")
        seen.add(frame)
        window = memory.read_exact(frame, FRAME_WINDOW)
        if window is None:
            return ThreadStack(tstate, tuple(frames), "unreadable frame")
        frame = _U64.unpack_from(window, layout.frame_previous)[0]
        if layout.entry_kind == ENTRY_SHIM and window[layout.frame_entry] >= layout.entry_value:
            if frames:  # the shim of an eval call: the frame before it was the call's first
                frames[-1] = replace(frames[-1], entry=True)
            continue
        code, instr = _frame_word(window, layout)
        if names and code not in infos:
            infos[code] = read_code(process.pid, code, layout, memory)
        frames.append(PyFrame(code, instr, _is_entry(window, layout), infos.get(code)))
    return ThreadStack(tstate, tuple(frames), "depth" if frame else None)


def _current_frame(memory: ProcessMemory, layout: PythonLayout, tstate: int) -> int | None:
    frame = memory.pointer(tstate + layout.tstate_frame)
    if frame and layout.cframe_current_frame >= 0:
        frame = memory.pointer(frame + layout.cframe_current_frame)
    return frame


def _frame_word(window: bytes, layout: PythonLayout) -> tuple[int, int]:
    """(code address, instruction in code units) of a frame, as the walker's frame word keeps them."""
    code = _U64.unpack_from(window, layout.frame_code)[0] & ~layout.code_tag_mask
    if layout.instr_kind == INSTR_POINTER:
        instr = (_U64.unpack_from(window, layout.frame_instr)[0] - (code + layout.code_adaptive)) // 2
    else:
        lasti = _I32.unpack_from(window, layout.frame_instr)[0]
        instr = lasti // 2 if layout.instr_kind == INSTR_LASTI_BYTES and lasti > 0 else lasti
    return python_frame_parts(python_frame_word(code, instr))


def _is_entry(window: bytes, layout: PythonLayout) -> bool:
    if layout.entry_kind == ENTRY_PER_CALL:
        return True
    return layout.entry_kind == ENTRY_FLAG and window[layout.frame_entry] != 0
