"""Python's view of a Python process's stacks, the default of every output (report and its formats, top, serve's
series, /debug/pprof/profile and OTLP): the interpreter's own frames below a sample's innermost Python frame
(``Frame.interpreter``: code of the python3.X executable or libpython that frame runs in: ``PyObject_Free``,
``PyLong_FromLong``, an unnamed ``python3.11+0x1fcc70`` of a stripped build) fold into that Python function, so
its self time is the time the interpreter spent running it, as py-spy shows it. Native code the Python
function called stays: C extensions, other libraries (libc's ``memmove`` under ``bytes.join``), the kernel.

Only the frames below the innermost Python frame fold: those between two Python frames (``sorted`` calling a
key function) and above the outermost (the interpreter's ``main``) stay where they are, so a stack's root and
its completeness are what they were. ``take_gil`` stays too: it says the Python function waited for the GIL
(report --gil, py-spy's GIL view). A sample without Python frames (an interpreter starting up) is unchanged.

The fold happens once, on symbolized samples (a record's, or what top and serve named of one drain); outputs
never see the interpreter's frames unless asked for them (``--python-internals``). For the leaves top and
serve name alone, :func:`leaf_depth` says how many frames a leaf-only sample keeps so that the Python view's
leaf is among them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from optrace.frontend.report.gilwaits import GIL_FUNCTIONS
from optrace.model import RUNTIME_FRAME, Frame, RawSample, Record, Sample, UserFrame

PYTHON_INTERNALS = "--python-internals"  # the option that shows the interpreter's frames (report, diff, top, serve)


def leaf_depth(user: Sequence[UserFrame]) -> int:
    """How many user frames (leaf first) a sample named for its leaf keeps: up to its innermost Python frame
    when it has one (the interpreter's frames below it fold into it), else 1."""
    for depth, frame in enumerate(user, 1):
        if frame.build_id == RUNTIME_FRAME:
            return depth
    return 1


def leaf_only(sample: RawSample) -> RawSample:
    """The sample with the frames its leaf needs (a view that names leaves only: top's self column, serve's
    series): its kernel leaf, else its user leaf, or up to the innermost Python frame (:func:`leaf_depth`)."""
    if sample.kernel:
        return dataclasses.replace(sample, user=(), kernel=sample.kernel[:1])
    return dataclasses.replace(sample, user=sample.user[:leaf_depth(sample.user)])


def python_view(frames: Sequence[Frame], samples: list[Sample]) -> list[Sample]:
    """``samples`` (indices into ``frames``) with the interpreter's frames below each innermost Python frame
    left out; samples whose stacks became the same are one sample (in the first one's place)."""
    return _fold(frames, samples)[0]


def python_view_record(record: Record) -> tuple[Record, int]:
    """The record with :func:`python_view` of its samples (those of the event it holds, see events.py), and how
    many samples (their counts) had frames folded."""
    samples, folded = _fold(record.frames, record.samples)
    return (record if samples is record.samples else dataclasses.replace(record, samples=samples)), folded


def _fold(frames: Sequence[Frame], samples: list[Sample]) -> tuple[list[Sample], int]:
    """Each distinct stack is folded once, and only one holding a Python frame (a set test, in C): a
    whole-machine record has tens of thousands of native stacks that never need it. Only the samples with a
    folded stack, or one that a folded stack became, are merged (in the first one's place); the others stay
    as they are."""
    fold = {index for index, frame in enumerate(frames) if frame.interpreter and frame.symbol not in GIL_FUNCTIONS}
    python = {index for index, frame in enumerate(frames) if frame.runtime}
    if not python or not fold:
        return samples, 0
    changed = _changed_stacks({sample.frames for sample in samples}, fold, python)
    if not changed:
        return samples, 0
    into = set(changed.values())  # an unchanged stack that one of them became merges with it
    merged: list[Sample] = []
    slots: dict[tuple[int, str, int, tuple[int, ...]], int] = {}
    folded = 0
    for sample in samples:
        stack = changed.get(sample.frames)
        if stack is None:
            if sample.frames not in into:
                merged.append(sample)
                continue
            stack = sample.frames
        else:
            folded += sample.count
        key = (sample.pid, sample.comm, sample.tid, stack)
        slot = slots.get(key)
        if slot is None:
            slots[key] = len(merged)
            merged.append(sample if stack is sample.frames else Sample(sample.pid, sample.comm, stack, sample.count,
                                                                       sample.tid))
        else:
            found = merged[slot]
            merged[slot] = Sample(found.pid, found.comm, stack, found.count + sample.count, found.tid)
    return merged, folded


def _changed_stacks(stacks: set[tuple[int, ...]], fold: set[int],
                    python: set[int]) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The stacks the fold changes, each without its ``fold`` frames below its innermost ``python`` frame
    (found with set tests and searches in C: a whole-machine record holds tens of thousands of stacks)."""
    changed = {}
    for stack in stacks:
        innermost = next(filter(python.__contains__, stack), None)
        if innermost is None:
            continue
        depth = stack.index(innermost)
        if depth and not fold.isdisjoint(stack[:depth]):
            changed[stack] = tuple(i for i in stack[:depth] if i not in fold) + stack[depth:]
    return changed
