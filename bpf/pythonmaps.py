"""The maps of the BPF Python walker (python.c): each Python process's interpreter as the walker needs it,
and the code objects it captured for naming.

A process is given with :meth:`PythonMaps.load_process` (frontend/runtimes/cpython/ found its interpreter and layout,
optrace/pythonlayout.py); its samples' eval frames are replaced by Python frames from then on. The captures
come through a perf buffer, read with the other event buffers; :meth:`PythonMaps.take_captures` hands them
over as bytes (optrace.pythonlayout.CAPTURE_HEADER then CAPTURE_PARTS), for frontend/runtimes/cpython/ to decode.
"""
from __future__ import annotations

import ctypes
import struct

from optrace.bpf.pidtables import forget_pid, has_pid
from optrace.pythonlayout import CAPTURE_SIZE, FRAME_WINDOW, PythonProcess

# enum python_status in python_walk.h, by value ("" for PY_OK)
PYTHON_STATUSES = ("", "no_thread", "read_fault", "depth_limit", "loop", "chain_end", "natives_cut")
# struct py_proc: runtime, two eval ranges, the code tag mask; 15 offsets; entry kind and value, instr kind,
# frame bytes; the process instance
PY_PROC = struct.Struct("<6Q15H4B2xI")
NO_OFFSET = 0xFFFF
MAX_CAPTURES = 65536  # captures held between two takes (a drain takes them): beyond, they are dropped


def python_status_name(value: int) -> str:
    return PYTHON_STATUSES[value] if value < len(PYTHON_STATUSES) else "read_fault"


def frame_bytes(layout) -> int:
    """The bytes of a frame the walker reads: up to the end of the last field it looks at (8-byte fields, the
    entry byte), rounded up to 8: a frame near the end of its mapping is still read whole. Below FRAME_WINDOW
    (python.c masks it to that)."""
    fields = [layout.frame_previous + 8, layout.frame_code + 8, layout.frame_instr + 8, layout.frame_entry + 1]
    return min(FRAME_WINDOW - 8, -(-max(fields) // 8) * 8)


def packed_process(process: PythonProcess, instance: int) -> bytes:
    """The py_proc value of a process (offsets are u16s: optrace.pythonlayout.MAX_OFFSET); ``instance``
    tells it from an earlier process with its pid (the walker captures a code object once per instance)."""
    layout = process.layout
    ranges = [*process.eval_ranges[:2], (0, 0), (0, 0)][:2]

    def offset(value: int) -> int:
        return NO_OFFSET if value < 0 else value

    return PY_PROC.pack(
        process.runtime, ranges[0][0], ranges[0][1], ranges[1][0], ranges[1][1], layout.code_tag_mask,
        layout.interpreters_head, layout.interp_threads_head, layout.tstate_next, layout.tstate_thread_id,
        layout.tstate_frame, offset(layout.cframe_current_frame), layout.frame_previous, layout.frame_code,
        layout.frame_instr, offset(layout.frame_entry), layout.code_adaptive, layout.code_name,
        layout.code_qualname, layout.code_filename, layout.code_linetable,
        layout.entry_kind, layout.entry_value, layout.instr_kind, frame_bytes(layout), instance & 0xFFFFFFFF)


class PythonMaps:
    """python.c's maps of a loaded BCC program (compiled with -DPYTHON_UNWIND). The capture buffer is
    opened here, before the caller builds its EventBuffers over every perf buffer of the program."""

    def __init__(self, bpf) -> None:
        self._procs = bpf[b"py_procs"]
        self._threads = bpf[b"py_threads"]
        self._captures: list[bytes] = []
        self.dropped = 0  # captures not held (more than MAX_CAPTURES between two takes), or lost by the kernel
        bpf[b"py_captures"].open_perf_buffer(self._on_capture, page_cnt=64, lost_cb=self._on_lost)

    def load_process(self, process: PythonProcess, instance: int) -> None:
        """The walker expands this process's eval frames from now on (``instance``: see packed_process)."""
        value = self._procs.Leaf()
        packed = packed_process(process, instance)
        if ctypes.sizeof(value) != len(packed):
            raise ValueError("internal error: python.c's struct py_proc is not the layout pythonmaps.py packs")
        ctypes.memmove(ctypes.addressof(value), packed, len(packed))
        self._procs[self._procs.Key(process.pid)] = value

    def forget_process(self, pid: int) -> None:
        forget_pid(self._procs, pid)

    def has_process(self, pid: int) -> bool:
        return has_pid(self._procs, pid)

    def take_captures(self) -> list[bytes]:
        """The code objects captured since the last call, each CAPTURE_SIZE bytes."""
        taken, self._captures = self._captures, []
        return taken

    def _on_capture(self, cpu: int, data, size: int) -> None:
        if len(self._captures) >= MAX_CAPTURES or size < CAPTURE_SIZE:
            self.dropped += 1
            return
        self._captures.append(ctypes.string_at(data, CAPTURE_SIZE))

    def _on_lost(self, count: int) -> None:
        self.dropped += count
