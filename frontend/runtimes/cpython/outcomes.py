"""What became of the samples of Python processes: with Python frames, native only, cut short, or refused.

The record keeps these counts (RecordMeta.runtimes["cpython"]) as it keeps the stacks'
outcomes, so a report says how much of a Python process's time it could name in Python terms, and why not.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from optrace.frontend.runtimes.cpython import FRAME_KIND
from optrace.frontend.runtimes.cpython.processes import PythonOutcome
from optrace.model import NAMED, Frame, RawSample, RuntimeCounts, Sample

LANGUAGE, PRODUCT = "Python", "CPython"  # RuntimeCounts.language and .product
WITH_FRAMES = NAMED
NATIVE_ONLY = "native_only"
REFUSED = "refused: "
CUT = "cut: "  # samples with Python frames cut short, by why: a part of WITH_FRAMES, not another outcome


def sample_outcomes(raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample],
                    outcomes: Mapping[int, PythonOutcome]) -> dict[str, int]:
    """Samples of the processes in ``outcomes`` by outcome: with Python frames, native only, why none (a walk
    that failed, an interpreter refused); and apart, ``cut: <why>``, those whose Python frames were cut
    short (a part of the first). ``rows`` are ``raw`` symbolized, in order."""
    counted: Counter[str] = Counter()
    for sample, row in zip(raw, rows, strict=True):
        outcome = outcomes.get(sample.pid)
        if outcome is None:
            continue
        has_frames = any(frames[i].kind == FRAME_KIND for i in row.frames)
        if outcome.process is None:
            counted[REFUSED + outcome.reason] += sample.count
        elif has_frames:
            counted[WITH_FRAMES] += sample.count
            if sample.runtime:
                counted[CUT + sample.runtime] += sample.count
        else:
            counted[sample.runtime or NATIVE_ONLY] += sample.count
    return dict(counted)


def runtime_counts(raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample],
                   outcomes: Mapping[int, PythonOutcome]) -> RuntimeCounts:
    """What the record keeps of CPython's processes (RecordMeta.runtimes["cpython"])."""
    return RuntimeCounts(LANGUAGE, PRODUCT, sample_outcomes(raw, frames, rows, outcomes), interpreters(outcomes))


def interpreters(outcomes: Mapping[int, PythonOutcome]) -> dict[str, int]:
    """Processes by interpreter ("3.11.2 /usr/bin/python3.11") or by why it was refused."""
    return dict(Counter(f"{o.process.version} {o.process.path}" if o.process else REFUSED + o.reason
                        for o in outcomes.values()))
