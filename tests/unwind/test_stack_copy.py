"""frontend/unwind/stackcopy.py walks a copied stack as bpf/unwind.c walks a live one (synthetic stacks with
known frames: rsp- and rbp-based rows, a frame-pointer frame, the outermost frame, a copy cut short)."""
from __future__ import annotations

import struct

from optrace.frontend.unwind.row import CFA_OUTERMOST, CFA_RBP, CFA_RSP, END, RBP_AT_CFA, RBP_SAME, Rule
from optrace.frontend.unwind.stackcopy import CHAIN_END, COPY_END, MAX_FRAMES, OUTERMOST, unwind_copy
from optrace.model import StackCopy

SP = 0x7ffd_0000_1000


def words(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def rules(table: dict[range, Rule | None]):
    def rule_at(pc: int) -> Rule | None:
        return next((rule for span, rule in table.items() if pc in span), None)
    return rule_at


def test_rsp_rbp_and_frame_pointer_frames_to_the_outermost():
    """leaf (rsp+16, ra at sp+8) -> middle (rbp-based, saved rbp at cfa-16) -> fp frame -> start (outermost)."""
    middle_bp = SP + 0x40
    stack = bytearray(0x100)
    stack[8:16] = words(0x2005)  # leaf's return address, into middle
    stack[0x40:0x48] = words(SP + 0x80)  # middle's saved rbp (cfa - 16 = bp)
    stack[0x48:0x50] = words(0x3005)  # middle's return address, into fp_frame
    stack[0x80:0x88] = words(0)  # fp_frame's saved rbp
    stack[0x88:0x90] = words(0x4005)  # its return address, into start
    table = {range(0x1000, 0x1100): Rule(CFA_RSP, 16, RBP_SAME, 0),
             range(0x2000, 0x2100): Rule(CFA_RBP, 16, RBP_AT_CFA, -16),
             range(0x3000, 0x3100): END,
             range(0x4000, 0x4100): Rule(CFA_OUTERMOST, 0, RBP_SAME, 0)}
    walk = unwind_copy(StackCopy(0x1010, SP, middle_bp, bytes(stack)), rules(table))
    assert walk.pcs == (0x1010, 0x2005, 0x3005, 0x4005) and walk.status == OUTERMOST


def test_a_stack_deeper_than_the_copy_ends_where_the_copy_does():
    table = {range(0x1000, 0x2000): Rule(CFA_RSP, 16, RBP_SAME, 0)}
    stack = words(0, 0x1005, 0, 0x1006)  # two frames of 16 bytes, the third's return address not copied
    walk = unwind_copy(StackCopy(0x1004, SP, 0, stack), rules(table))
    assert walk.pcs == (0x1004, 0x1005, 0x1006) and walk.status == COPY_END


def test_a_zero_return_address_ends_the_chain_and_a_loop_is_bounded():
    table = {range(0x1000, 0x2000): Rule(CFA_RSP, 16, RBP_SAME, 0)}
    assert unwind_copy(StackCopy(0x1004, SP, 0, words(0, 0)), rules(table)).status == CHAIN_END
    looping = Rule(CFA_RSP, 8, RBP_SAME, 0)  # cfa = sp + 8, ra at sp: the same frame again and again
    walk = unwind_copy(StackCopy(0x1004, SP, 0, words(*([0x1004] * 600))), rules({range(0x1000, 0x2000): looping}))
    assert len(walk.pcs) == MAX_FRAMES


def test_a_copied_python_stack_takes_each_eval_calls_frames():
    """The thread's Python frames read with the copy (copypython.c: CHAIN_WORD, each call's last marked
    CHAIN_CALL_END) replace the walk's eval frames, call by call; the frames the walk to the copy put stay in
    front, a native frame stays native, an eval frame with no frames left stays as it is."""
    from optrace.frontend.unwind.stackcopy import CHAIN_CALL_END, CHAIN_WORD, chain_of, with_runtime_frames
    from optrace.model import RUNTIME_FRAME, UserFrame
    from optrace.pythonlayout import python_frame_word

    py = [python_frame_word(0x7000 + 8 * i, i) for i in range(4)]
    walked = (UserFrame(b"x" * 20, 0x10), UserFrame(RUNTIME_FRAME, py[0]))
    chain = (UserFrame(RUNTIME_FRAME, py[1] | CHAIN_WORD), UserFrame(RUNTIME_FRAME, py[2] | CHAIN_WORD | CHAIN_CALL_END),
             UserFrame(RUNTIME_FRAME, py[3] | CHAIN_WORD | CHAIN_CALL_END))
    assert chain_of(walked + chain) == (walked, chain)
    pcs = (0x5000, 0x1234, 0x5010, 0x5020, 0x9000)  # eval, native, eval, eval (nothing left), native
    frames = tuple(UserFrame(b"n" * 20, pc) for pc in pcs)
    merged, rest = with_runtime_frames(pcs, frames, chain, ((0x5000, 0x6000),))
    assert merged == (UserFrame(RUNTIME_FRAME, py[1]), UserFrame(RUNTIME_FRAME, py[2]), frames[1],
                      UserFrame(RUNTIME_FRAME, py[3]), frames[3], frames[4]) and not rest


def test_copies_hold_as_many_frames_as_the_bpf_walkers_stacks():
    """A copied sample keeps as many frames as a walked one (a stored stack's most: stackstore.c's
    STORE_MAX_WORDS): a 300-deep Python chain merged into a copy stays whole. At 256 (the walker's cap before
    stacks held 508) 3.14's 300-deep copies lost their 50 outermost Python frames: 7 % of the samples of
    tests/python/test_deep_stacks.py in CI, 10-21 % here at load 12 (the more load, the longer tables take and the
    more samples are copies)."""
    import re

    from optrace.frontend.unwind.stackcopy import CHAIN_CALL_END, CHAIN_WORD, with_runtime_frames
    from optrace.model import RUNTIME_FRAME, UserFrame
    from optrace.pythonlayout import python_frame_word
    from support import REPO

    store = (REPO / "bpf" / "stackstore.c").read_text()
    assert MAX_FRAMES == int(re.search(r"#define STORE_MAX_WORDS (\d+)", store).group(1))
    py = [python_frame_word(0x7000 + 8 * i, i) for i in range(304)]
    chain = tuple(UserFrame(RUNTIME_FRAME, word | CHAIN_WORD) for word in py[:-1]) + (
        UserFrame(RUNTIME_FRAME, py[-1] | CHAIN_WORD | CHAIN_CALL_END),)
    pcs = (0x5000, 0x9000, 0x9100)  # the eval frame, its native callers to _start
    frames = tuple(UserFrame(b"n" * 20, pc) for pc in pcs)
    merged, rest = with_runtime_frames(pcs, frames, chain, ((0x5000, 0x6000),))
    assert merged == tuple(UserFrame(RUNTIME_FRAME, word) for word in py) + frames[1:] and not rest


def test_a_copy_cut_short_keeps_the_rest_of_the_python_chain():
    """Up to 3.10 each Python call is 3-4 native frames: a copy's bytes end after some 47 calls of a 300-deep
    stack (a copy's walk: copy_end). The chain's frames left follow what the walk put, without the natives
    among them (as unwind.c's rest mode: status natives_cut); a walk that reached the thread's root puts
    none after it (its eval frames took them all, or they do not belong after the root)."""
    from optrace.frontend.unwind.stackcopy import CHAIN_CALL_END, CHAIN_WORD, with_runtime_frames
    from optrace.model import RUNTIME_FRAME, UserFrame
    from optrace.pythonlayout import python_frame_word

    py = [python_frame_word(0x7000 + 8 * i, i) for i in range(300)]
    chain = tuple(UserFrame(RUNTIME_FRAME, word | CHAIN_WORD | CHAIN_CALL_END) for word in py)  # a call each
    pcs = (0x5000, 0x1234, 0x5010, 0x1234)  # two eval calls in the copied bytes, each under a native frame
    frames = tuple(UserFrame(b"n" * 20, pc) for pc in pcs)
    ranges = ((0x5000, 0x6000),)
    merged, rest = with_runtime_frames(pcs, frames, chain, ranges, walk_cut=True)
    assert rest and merged == (UserFrame(RUNTIME_FRAME, py[0]), frames[1], UserFrame(RUNTIME_FRAME, py[1]), frames[3],
                               *(UserFrame(RUNTIME_FRAME, word) for word in py[2:]))
    merged, rest = with_runtime_frames(pcs, frames, chain, ranges, walk_cut=False)
    assert not rest and len(merged) == 4
