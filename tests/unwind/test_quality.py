"""Stack quality (frontend/unwind/quality.py) on named stacks: a thread's root reached through a frame in no
mapping is not complete (no BPF)."""
from __future__ import annotations

from optrace.frontend.unwind.quality import stack_quality
from optrace.model import STACK_COMPLETE, UNKNOWN, Frame, RawSample, Sample, UserFrame

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
FRAMES = [Frame("clone3", LIBC), Frame(UNKNOWN, UNKNOWN, resolved=False), Frame("start_thread", LIBC),
          Frame("work", "/bin/w"), Frame("schedule", "[kernel.kallsyms]", kind="kernel")]
CLONE3, LOST, START, WORK, SCHEDULE = range(len(FRAMES))


def quality(*stacks: tuple[tuple[int, ...], str, int]) -> dict[str, int]:
    raw = [RawSample(1, "w", (UserFrame(None, 1),) * len(frames), (), count, stop=stop) for frames, stop, count in stacks]
    rows = [Sample(1, "w", (SCHEDULE, *frames), count) for frames, _, count in stacks]
    return stack_quality(raw, FRAMES, rows)


def test_a_root_reached_through_a_frame_in_no_mapping_is_not_complete():
    """A thread preempted just after clone3 (ret_from_fork), whose next instructions have no CFI: frame
    pointers made a run of [unknown] up to a frame CFI calls outermost. Cut, counted apart; a whole stack,
    or a new thread's lone clone3, is complete; a walk that ended in [unknown] keeps its reason."""
    assert quality(((CLONE3, LOST, LOST, CLONE3), "outermost", 700),
                   ((WORK, START, CLONE3), "outermost", 300),
                   ((CLONE3,), "outermost", 50),
                   ((CLONE3, LOST), "no_cfi", 20)) == {"unknown_frame": 700, STACK_COMPLETE: 350, "no_cfi": 20}


def test_a_sample_whose_copy_was_given_up_with_no_user_frame_is_cut_not_left_out():
    """A short-lived process's sample whose stack copy was given up (its tables never came) keeps no user
    frame when the kernel stored no leaf with the copy: it read kernel-only (in exit_mmap, at a page fault)
    and was in no outcome, so the header's share of complete stacks left it out (issue 43: 14-19 % of
    cc1's samples in a small-file compile loop on main 45eafc0). A kernel thread's sample (no user stack, no reason) stays out."""
    assert quality(((WORK, START), "outermost", 90), ((), "no_table", 10), ((), "", 5)) == {
        STACK_COMPLETE: 90, "no_table": 10}
