"""Unwinding a copy of a user stack in user space, as perf's dwarf mode does: the registers and the first
bytes of the stack a sample took when its process's tables were not loaded yet (a process's first samples),
walked later with the same tables and rules as the BPF walker (bpf/unwind.c), once they are built.

The walk is unwind.c's, frame by frame: the row for the PC (a return address is looked up at pc - 1), the
CFA from rsp or rbp, the return address at CFA - 8 and the caller's rbp where the row says, read from the
copy. It stops where unwind.c stops (no CFI, an expression, the outermost frame), and also where the copy
ends: a stack deeper than the copy is cut there, and says so.

A Python process's copy comes with its thread's Python frames that the walk to the copy did not put, taken
when the copy was (the chain is in the heap: bpf/copypython.c), after the sample's user stack: :func:`chain_of`
tells them apart, :func:`with_runtime_frames` puts each eval call's frames in place of its frame in the eval
function, as the BPF walker does.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from optrace.frontend.unwind.row import (CFA_END, CFA_OUTERMOST, CFA_PLT, CFA_RBP, CFA_RSP, RBP_AT_CFA, RBP_SAME,
                                         Rule)
from optrace.model import RUNTIME_FRAME, StackCopy, UserFrame

MAX_FRAMES = 508  # as the BPF walker's stacks (unwind.c's UNWIND_STACK_CAP: stackstore.c's STORE_MAX_WORDS)
CHAIN_CALL_END = 1 << 61  # in a copied sample's Python frame word: its eval call's last frame (copypython.c)
CHAIN_WORD = 1 << 60  # a Python frame word read with the copy, not walked with the sample's stack
_U64 = struct.Struct("<Q")

# Why a copy's walk ended (the names of bpf/unwindmaps.py's UNWIND_STATUSES, and "copy_end")
OUTERMOST = "outermost"
CHAIN_END = "chain_end"
NO_CFI = "no_cfi"
EXPRESSION = "expression"
READ_FAULT = "read_fault"
DEPTH = "depth_limit"
COPY_END = "copy_end"  # the copied bytes ended before the stack did
ROOT_REACHED = (OUTERMOST, CHAIN_END)  # the walks that end at the thread's root
NATIVES_CUT = "natives_cut"  # a Python status (bpf/pythonmaps.py): Python frames put without the natives among them

# pc -> (the rule for that address of its file, or None where the file has no row), None outside every
# mapping with a table: the caller's view of the process's mappings and their tables
RuleAt = Callable[[int], "Rule | None"]


@dataclass(frozen=True)
class CopyWalk:
    pcs: tuple[int, ...]  # leaf first
    status: str


def unwind_copy(copy: StackCopy, rule_at: RuleAt, max_frames: int = MAX_FRAMES) -> CopyWalk:
    """The PCs of the copied stack's frames and why the walk stopped (at most ``max_frames`` of them)."""
    pcs: list[int] = []
    ip, sp, bp = copy.ip, copy.sp, copy.bp
    first = 0 if copy.return_address else 1  # the frames whose PC is where the thread was, not a return address
    for _ in range(max_frames):
        pcs.append(ip)
        rule = rule_at(ip - 1 if len(pcs) > first else ip)
        step = _caller(rule, ip, sp, bp, copy)
        if isinstance(step, str):
            return CopyWalk(tuple(pcs), step)
        ip, sp, bp = step
    return CopyWalk(tuple(pcs), DEPTH)


def _caller(rule: Rule | None, ip: int, sp: int, bp: int, copy: StackCopy) -> tuple[int, int, int] | str:
    """The caller's (ip, sp, bp), or why there is none."""
    if rule is None or rule.cfa_type == CFA_END:
        return _frame_pointers(sp, bp, copy)
    if rule.cfa_type == CFA_OUTERMOST:
        return OUTERMOST
    if rule.cfa_type == CFA_RSP:
        cfa = sp + rule.cfa_offset
    elif rule.cfa_type == CFA_RBP:
        cfa = bp + rule.cfa_offset
    elif rule.cfa_type == CFA_PLT:
        cfa = sp + rule.cfa_offset + (8 if (ip & 15) >= 11 else 0)
    else:
        return EXPRESSION if rule.unsupported else NO_CFI
    if cfa <= sp:
        return READ_FAULT
    ra = _word(copy, cfa - 8)
    if isinstance(ra, str):
        return ra
    if rule.rbp_type == RBP_AT_CFA:
        bp = _word(copy, cfa + rule.rbp_offset)
        if isinstance(bp, str):
            return bp
    elif rule.rbp_type != RBP_SAME:
        return EXPRESSION
    return (ra, cfa, bp) if ra else CHAIN_END


def _frame_pointers(sp: int, bp: int, copy: StackCopy) -> tuple[int, int, int] | str:
    """Where there is no CFI: the caller's rbp at rbp, the return address above it (unwind.c's CFA_END)."""
    if not bp:
        return CHAIN_END
    if bp < sp:
        return NO_CFI
    saved, ra = _word(copy, bp), _word(copy, bp + 8)
    if isinstance(saved, str) or isinstance(ra, str):
        return saved if isinstance(saved, str) else ra
    return (ra, bp + 16, saved) if ra else CHAIN_END


def _word(copy: StackCopy, address: int) -> int | str:
    at = address - copy.sp
    if at < 0:
        return READ_FAULT
    if at + 8 > len(copy.stack):
        return COPY_END
    return _U64.unpack_from(copy.stack, at)[0]


def with_runtime_frames(pcs: tuple[int, ...], frames: tuple[UserFrame, ...], chain: tuple[UserFrame, ...],
                       runtime_ranges: tuple[tuple[int, int], ...],
                       walk_cut: bool = False) -> tuple[tuple[UserFrame, ...], bool]:
    """``frames`` (of the walked ``pcs``) with each frame in the eval function (``runtime_ranges``) replaced by
    the Python frames its call ran: the next ones of ``chain`` (the thread's Python frames when the copy was
    taken, leaf first, each call's last marked CHAIN_CALL_END), as unwind.c puts them (an eval frame with
    none left stays as it is). When the walk stopped short of the thread's root (``walk_cut``: the copy's
    bytes ended, or its rules), the chain's frames left follow, without the native frames among them, as
    unwind.c's rest mode puts them (up to 3.10 a Python call is 3-4 native frames: a copy's 16-odd KiB held
    the first 47 of 300). At most MAX_FRAMES frames; and whether frames were put after the walk."""
    words = [frame.offset for frame in chain]
    out: list[UserFrame] = []
    taken = 0
    for pc, frame in zip(pcs, frames):
        if taken < len(words) and any(start <= pc < end for start, end in runtime_ranges):
            while taken < len(words):
                word = words[taken]
                taken += 1
                out.append(UserFrame(RUNTIME_FRAME, word & ~(CHAIN_CALL_END | CHAIN_WORD)))
                if word & CHAIN_CALL_END:
                    break
        else:
            out.append(frame)
    rest = walk_cut and taken < len(words) and len(out) < MAX_FRAMES
    if rest:
        out.extend(UserFrame(RUNTIME_FRAME, word & ~(CHAIN_CALL_END | CHAIN_WORD)) for word in words[taken:])
    return tuple(out[:MAX_FRAMES]), rest


def chain_of(frames: tuple[UserFrame, ...]) -> tuple[tuple[UserFrame, ...], tuple[UserFrame, ...]]:
    """(the frames the walk to the copy put, the chain read with the copy) of a copied sample's user stack."""
    chained = [f.build_id == RUNTIME_FRAME and bool(f.offset & CHAIN_WORD) for f in frames]
    return (tuple(f for f, c in zip(frames, chained) if not c), tuple(f for f, c in zip(frames, chained) if c))


def without_call_ends(frames: tuple[UserFrame, ...]) -> tuple[UserFrame, ...]:
    """A copied sample's user stack as it is named when its copy is not walked (its Python frames' marks off)."""
    return tuple(UserFrame(RUNTIME_FRAME, f.offset & ~(CHAIN_CALL_END | CHAIN_WORD)) if f.build_id == RUNTIME_FRAME
                 else f for f in frames)
