"""Off-CPU time joined to its wakers (record --off-cpu --wakers): each wait that slept, with the stacks of the
thread that woke it at the wake-up (bpf/wakers.c), as :class:`~optrace.model.Wakeup` rows of the record.

`report --wakers` shows them as BCC's offwaketime folds them: one stack per (blocked stack, waker stack), the
blocked stack from its root to where it slept, then a ``--`` frame, then the waker's stack from its leaf (the
wake-up in the kernel) down to its root, then the waker's command, so a flame graph shows the blocked stack
growing up and the waker's hanging above it upside down. Every format prints these joined stacks (they are a
record's samples with two kinds of made-up frames, in :data:`WAKER_DSO`): folded lines read
``comm;blocked root;...;blocked leaf;--;waker leaf;...;waker root;waker comm N``.

A waker in an interrupt (a timer, a device's completion) is whatever thread the interrupt came in, or the
idle task: its kernel stack says so (:data:`INTERRUPT_FRAMES`), and only the interrupt's part of it is kept
(up to its entry, :data:`INTERRUPT_ENTRY`), under the command ``[interrupt]``.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

from optrace.errors import OptraceError
from optrace.frontend.report.events import TRACEPOINT_FRAMES
from optrace.model import Frame, Record, Sample, Wakeup

WAKER_DSO = "[waker]"
SEPARATOR = Frame(symbol="--", dso=WAKER_DSO)  # between the blocked stack and its waker's (offwaketime's)
NO_WAKER = "[unknown]"  # the waker's command when none was seen (a wake-up the tracepoint missed, or lost)
INTERRUPT = "[interrupt]"  # the waker's command when an interrupt woke the thread
# Kernel functions that say a wake-up came from an interrupt (x86's entry points, the soft-interrupt loop)
INTERRUPT_FRAMES = ("asm_sysvec_", "asm_common_interrupt", "sysvec_", "common_interrupt", "handle_softirqs",
                    "__do_softirq", "do_softirq", "irq_exit_rcu", "hrtimer_interrupt", "__sysvec_")
INTERRUPT_ENTRY = ("asm_sysvec_", "asm_common_interrupt")  # past it, the stack is the interrupted thread's


def merged_samples(samples: list[Sample]) -> list[Sample]:
    """Samples of equal (pid, comm, frames, tid) summed into one (a wait's waker no longer tells them apart)."""
    counts: Counter[tuple] = Counter()
    for s in samples:
        counts[(s.pid, s.comm, s.frames, s.tid)] += s.count
    return [Sample(pid, comm, frames, count, tid) for (pid, comm, frames, tid), count in counts.items()]


def wakeup_rows(blocked: list[Sample], wakers: list[Sample | None]) -> list[Wakeup]:
    """The waits that slept (``wakers[i]`` is ``blocked[i]``'s waker, named; None for a preempted wait),
    equal rows summed. A waker without a command is one that was not seen."""
    counts: Counter[tuple] = Counter()
    for wait, waker in zip(blocked, wakers):
        if waker is not None:
            counts[(wait.pid, wait.comm, wait.frames, wait.tid, waker.pid, waker.tid, waker.comm, waker.frames)] += wait.count
    return [Wakeup(pid, comm, frames, count, tid, waker_pid, waker_tid, waker_comm, waker_frames)
            for (pid, comm, frames, tid, waker_pid, waker_tid, waker_comm, waker_frames), count in counts.items()]


def with_wakers(record: Record, event: str) -> Record:
    """``record`` (its samples the event's, events.event_record) with the off-CPU time that slept as joined
    stacks: ``off-cpu`` shows only them, ``wall`` its on-CPU time next to them."""
    meta = record.meta.off_cpu
    if event == "cpu":
        raise OptraceError("--wakers shows off-CPU time: use it with --event off-cpu or wall")
    if meta is None or not meta.wakers:
        raise OptraceError("the record holds no wakers: record with --off-cpu --wakers (or --wall --wakers)")
    frames = list(record.frames)
    joined = _Joiner(frames)
    samples = [joined.sample(w) for w in record.wakeups]
    if event == "wall":  # events.event_record: the on-CPU samples first (as time), then the off-CPU ones
        samples = record.samples[:len(record.samples) - len(record.off_cpu)] + samples
    return dataclasses.replace(record, frames=frames, samples=samples)


def joined_total(record: Record) -> int:
    """The off-CPU time the record's wakeups hold: the waits that slept."""
    return sum(w.count for w in record.wakeups)


class _Joiner:
    """Joined stacks over one frame table (``frames``, extended with the made-up frames they need)."""

    def __init__(self, frames: list[Frame]) -> None:
        self._frames = frames
        self._index: dict[Frame, int] = {}
        self._machinery = [f.kernel and f.symbol.startswith(TRACEPOINT_FRAMES) for f in frames]
        self._interrupt = [f.kernel and f.symbol.startswith(INTERRUPT_FRAMES) for f in frames]
        self._separator = self._made_up(SEPARATOR)

    def sample(self, wakeup: Wakeup) -> Sample:
        """Leaf first: the waker's command, its stack from its root to the wake-up, ``--``, the blocked stack."""
        blocked = self._without_machinery(wakeup.frames)
        waker = self._without_machinery(wakeup.waker_frames)
        comm = wakeup.waker_comm or NO_WAKER
        if any(self._interrupt[i] for i in waker):
            comm, waker = INTERRUPT, self._interrupt_part(waker)
        top = self._made_up(Frame(symbol=comm, dso=WAKER_DSO))
        return Sample(wakeup.pid, wakeup.comm, (top, *reversed(waker), self._separator, *blocked), wakeup.count,
                      wakeup.tid)

    def _interrupt_part(self, frames: tuple[int, ...]) -> tuple[int, ...]:
        """An interrupt's frames, from the wake-up to the interrupt's entry (all kernel frames without one)."""
        kernel = tuple(i for i in frames if self._frames[i].kernel)
        entries = [n for n, i in enumerate(kernel) if self._frames[i].symbol.startswith(INTERRUPT_ENTRY)]
        return kernel[:entries[0] + 1] if entries else kernel

    def _without_machinery(self, frames: tuple[int, ...]) -> tuple[int, ...]:
        """The stack without the tracepoint's frames at its leaf end (where it was taken, not where it was)."""
        cut = 0
        while cut < len(frames) - 1 and self._machinery[frames[cut]]:
            cut += 1
        return frames[cut:]

    def _made_up(self, frame: Frame) -> int:
        index = self._index.get(frame)
        if index is None:
            index = self._index[frame] = len(self._frames)
            self._frames.append(frame)
            self._machinery.append(False)
            self._interrupt.append(False)
        return index
