"""A runtime's frame word in a stored stack (docs/runtimes.md): what the BPF walkers store for a frame of a
runtime's code, told apart from a file frame (bit 63) and a raw address.

Bits 63-62 are 01, bits 59-56 the runtime's id (frontend/runtimes/registry.py), bits 61-60 mark a copy's chain
(frontend/unwind/stackcopy.py), bits 55-0 are the runtime's own (CPython: optrace/pythonlayout.py).
"""
from __future__ import annotations

RUNTIME_WORD = 1 << 62
ID_SHIFT = 56
ID_MASK = 0xF
OWN_BITS = 56
MAX_ID = ID_MASK


def runtime_word(runtime_id: int, own: int) -> int:
    """The frame word a runtime's walker stores for ``own`` (its 56 bits)."""
    return RUNTIME_WORD | (runtime_id & ID_MASK) << ID_SHIFT | own & ((1 << OWN_BITS) - 1)


def is_runtime_word(word: int) -> bool:
    return word >> 62 == 1


def word_runtime(word: int) -> int:
    """The id of the runtime whose walker stored ``word`` (a runtime word)."""
    return word >> ID_SHIFT & ID_MASK
