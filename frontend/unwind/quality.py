"""Stack quality: how many sampled user stacks were complete, and why the others stopped.

A stack is complete when its outermost frame is a thread's root (``_start`` or
``__libc_start_call_main`` for a main thread, ``clone3``/``start_thread`` for the others), or when the
CFI unwinder reached a frame whose return address the CFI declares undefined (the ABI's mark of a
thread's first frame), and none of its user frames is ``[unknown]`` (an address in no mapping: a walk gone
astray, e.g. a thread preempted just after clone3, whose next instructions have no CFI: its stack read
``clone3`` then a run of ``[unknown]``; ``unknown_frame``). Otherwise the reason is the unwinder's (see
bpf/unwindmaps.py UNWIND_STATUSES), or ``fp_walk`` for a stack the kernel walked by frame pointers. A sample
left with no user frame but a reason (its copy given up, ``no_table``: a short-lived compiler's sample at a
page fault or in exit_mmap read kernel-only) counts under that reason.

:func:`stack_quality` looks at stacks a recording named whole; :func:`outermost_quality` gives the same
counts naming one frame per stack at most (serve names only leaves).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from optrace.model import STACK_COMPLETE, UNKNOWN, Frame, RawSample, Sample

THREAD_ROOTS = frozenset({"_start", "__libc_start_call_main", "__libc_start_main", "__libc_start_main_impl",
                          "clone3", "__clone3", "clone", "__clone", "start_thread"})
FP_WALK = "fp_walk"
OUTERMOST = "outermost"  # the unwinder's status for a walk that reached a thread's first frame (unwind.c)
UNKNOWN_FRAME = "unknown_frame"  # a root reached, through a frame in no mapping


def stack_quality(raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample]) -> dict[str, int]:
    """Samples with a user stack, by outcome (their counts: samples, or off-CPU nanoseconds); ``rows`` are
    ``raw`` symbolized, in the same order."""
    lost = [not frame.kernel and frame.symbol == UNKNOWN for frame in frames]
    outcomes: Counter[str] = Counter()
    for sample, row in zip(raw, rows, strict=True):
        if not sample.user:
            if sample.stop:  # walked or copied, and nothing of it kept (a copy given up): cut, not left out
                outcomes[sample.stop] += sample.count
            continue
        outermost = frames[row.frames[-1]] if row.frames else None
        if not (sample.stop == OUTERMOST or (outermost is not None and not outermost.kernel
                                             and outermost.symbol in THREAD_ROOTS)):
            outcomes[sample.stop or FP_WALK] += sample.count
        elif any(map(lost.__getitem__, row.frames)):  # in C: a deep recursion's rows are thousands of frames
            outcomes[UNKNOWN_FRAME] += sample.count
        else:
            outcomes[STACK_COMPLETE] += sample.count
    return dict(outcomes)


def outermost_only(raw: Sequence[RawSample]) -> list[RawSample]:
    """The samples whose outcome depends on their outermost frame's name, reduced to that frame: those with
    a user stack the unwinder did not end at a thread's first frame."""
    return [dataclasses.replace(s, user=s.user[-1:], kernel=()) for s in raw if s.user and s.stop != OUTERMOST]


def outermost_quality(raw: Sequence[RawSample], outermost: Sequence[RawSample], frames: Sequence[Frame],
                      rows: Sequence[Sample]) -> dict[str, int]:
    """:func:`stack_quality` of ``raw``, from ``outermost`` (:func:`outermost_only` of ``raw``) named as
    ``rows`` (their frames in ``frames``)."""
    outcomes = Counter(stack_quality(outermost, frames, rows))
    outcomes[STACK_COMPLETE] += sum(s.count for s in raw if s.user and s.stop == OUTERMOST)
    return {outcome: n for outcome, n in outcomes.items() if n}
