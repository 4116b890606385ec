"""A reference stack walker in Python over the unwind tables, for the tests: it reads a stopped process's
registers (ptrace) and stack (/proc/PID/mem) and applies the rows exactly as the contract in
frontend/unwind/table.py says the BPF unwinder must (imported by name: tests/unwind is on sys.path)."""
from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass

from optrace.frontend.unwind.cache import UnwindTableCache
from optrace.frontend.unwind.table import (CFA_END, CFA_OUTERMOST, CFA_PLT, CFA_RBP, CFA_RSP, RBP_AT_CFA,
                                           RBP_SAME)
from optrace.procfs import MapEntry, read_maps

PTRACE_GETREGS, PTRACE_ATTACH, PTRACE_DETACH = 12, 16, 17
USER_REGS = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base "
             "gs_base ds es fs gs").split()
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


@dataclass
class Frame:
    pc: int
    entry: MapEntry | None
    vaddr: int | None  # the file's virtual address of the pc (of pc - 1 for a return address)
    how: str  # "cfi" or "fp": how the caller of this frame was found


def sample(pid: int, cache: UnwindTableCache) -> tuple[list[Frame], str]:
    """Stop ``pid`` where it is (PTRACE_ATTACH), walk its stack, let it run again."""
    if _libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), "PTRACE_ATTACH failed")
    try:
        os.waitpid(pid, 0)
        regs = (ctypes.c_ulonglong * len(USER_REGS))()
        if _libc.ptrace(PTRACE_GETREGS, pid, None, ctypes.byref(regs)) != 0:
            raise OSError(ctypes.get_errno(), "PTRACE_GETREGS failed")
        return walk(pid, dict(zip(USER_REGS, regs)), cache)
    finally:
        _libc.ptrace(PTRACE_DETACH, pid, None, None)


def walk(pid: int, regs: dict[str, int], cache: UnwindTableCache, max_frames: int = 64) -> tuple[list[Frame], str]:
    """(frames, why it stopped: "complete", "expression", "no mapping", "no cfi", "read fault", "depth"),
    from the registers of the stopped process ``pid``. "no cfi": frame pointers could not go on from code
    without CFI (as the BPF walker's UNWIND_NO_CFI), e.g. libgmp's hand-written mpn_* routines."""
    maps = [entry for entry in read_maps(pid).entries if entry.executable]
    pc, sp, bp = regs["rip"], regs["rsp"], regs["rbp"]
    frames: list[Frame] = []
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        def read(address: int) -> int:
            mem.seek(address)
            return struct.unpack("<Q", mem.read(8))[0]

        for depth in range(max_frames):
            entry = next((e for e in maps if e.contains(pc)), None)
            if entry is None:
                return frames, "no mapping"
            unwind = cache.file_of_mapping(pid, entry) if entry.is_file else None
            lookup = pc - 1 if depth else pc  # a return address: the call is the byte before it
            vaddr = unwind.file_vaddr(entry, lookup) if unwind else None
            rule = unwind.table.find(vaddr) if unwind else None
            frames.append(Frame(pc, entry, vaddr, "fp" if rule is None or rule.cfa_type == CFA_END else "cfi"))
            try:
                if rule is None or rule.cfa_type == CFA_END:  # frame pointers
                    cfa, caller_bp = bp + 16, read(bp)
                elif rule.cfa_type == CFA_OUTERMOST:
                    return frames, "complete"
                elif rule.cfa_type in (CFA_RSP, CFA_RBP, CFA_PLT) and rule.rbp_type in (RBP_SAME, RBP_AT_CFA):
                    base = bp if rule.cfa_type == CFA_RBP else sp
                    cfa = base + rule.cfa_offset + (8 if rule.cfa_type == CFA_PLT and (pc & 15) >= 11 else 0)
                    caller_bp = read(cfa + rule.rbp_offset) if rule.rbp_type == RBP_AT_CFA else bp
                else:
                    return frames, "expression"
                pc, sp, bp = read(cfa - 8), cfa, caller_bp
            except (OSError, struct.error):
                return frames, "no cfi" if rule is None else "read fault"
    return frames, "depth"
