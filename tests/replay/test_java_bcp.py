"""The interpreted leaf's bytecode index on stored snapshots when r13 is not the leaf's bytecode pointer: a
thread stopped as a callee returns holds rbp at the caller's frame while r13 still points into the callee's
bytecodes (laid out after the caller's in metaspace: a live JDK 17 gave Phases.hashPhase, 48 bytes of code,
bci 246 and line 0). The walk takes the bci from r13 only inside the leaf method's own code, else from the
frame's saved bytecode pointer (frontend/runtimes/hotspot/walker.py's _bci)."""
from __future__ import annotations

import dataclasses

import pytest

from javasnapshots import load_java, process_of, replay_java
from snapshots import names

WORD = 8
INTERPRETED_LEAVES = [name for name in names("java-")  # stopped in the interpreter (not walked from an anchor)
                      if not load_java(name).from_anchor and load_java(name).expected[0].kind == "interpreted"]


def test_a_snapshot_has_an_interpreted_leaf():
    assert INTERPRETED_LEAVES, "no stored snapshot stops in the interpreter: this case is not checked"


@pytest.mark.parametrize("name", INTERPRETED_LEAVES)
def test_r13_past_the_leaf_method_code_is_not_its_bci(name):
    snapshot = load_java(name)
    process = process_of(snapshot)
    bp, r13 = snapshot.registers["bp"], snapshot.registers["r13"]
    method = process.memory.pointer(bp + WORD * process.layout.interpreter_frame["method"])
    code_size = process.method(method).code_size
    leaf = snapshot.expected[0]
    assert 0 <= leaf.bci < code_size and leaf.line > 0, leaf  # r13 is inside the leaf's code in the snapshot
    saved = replay_java(dataclasses.replace(snapshot, registers={**snapshot.registers, "r13": 0})).frames[0]
    assert 0 <= saved.bci < code_size and saved.line > 0, saved  # the frame's saved bytecode pointer
    for past in (code_size - leaf.bci, code_size - leaf.bci + 200):  # the next method's first bytecode, further
        moved = dataclasses.replace(snapshot, registers={**snapshot.registers, "r13": r13 + past})
        assert replay_java(moved).frames[0] == saved
