"""Python's GIL waits: time a thread spent off CPU in the interpreter's ``take_gil``, wanting the GIL.

An off-CPU stack that runs through ``take_gil`` says which Python function wanted the GIL (the Python frames
above it) and how long it waited; `report --gil` keeps those stacks only, and a report's header says how much
of the time they are. ``take_gil`` is named from the interpreter's symbols, or found where it has none
(frontend/runtimes/cpython/gilfunction.py).
"""
from __future__ import annotations

import dataclasses

from optrace.model import Record, Sample

GIL_FUNCTIONS = frozenset({"take_gil"})  # CPython 3.8 to 3.14 (Python/ceval_gil.c)


def _gil_frames(record: Record) -> set[int]:
    return {i for i, frame in enumerate(record.frames) if not frame.kernel and frame.symbol in GIL_FUNCTIONS}


def gil_samples(record: Record) -> list[Sample]:
    """The samples whose stack runs through take_gil."""
    frames = _gil_frames(record)
    return [s for s in record.samples if frames.intersection(s.frames)] if frames else []


def gil_waits_only(record: Record) -> Record:
    """The record with only its GIL waits (of the event its samples are: see events.event_record)."""
    return dataclasses.replace(record, samples=gil_samples(record))
