"""The BPF Python walker (bpf/python.c over bpf/unwind.c) replayed on stored snapshots of CPython 3.8-3.13 and
Debian's 3.11 (snapshots/, made by make_snapshot.py): the stack the kernel's rules give from the snapshot's
registers and memory, named as frontend/runtimes/cpython/ names it, is the stack stored with the snapshot. No timing,
no BPF load, no live process: the walker's correctness on every interpreter at every run."""
from __future__ import annotations

import dataclasses

import pytest

from optrace.pythonlayout import INSTR_POINTER, PythonLayout
from snapshots import load, names, replay_snapshot

SNAPSHOTS = names()
# Fields of PythonLayout that are byte offsets (kinds, masks and the version are not)
# A field moved one way that reads the same value by construction, and why (the other way must still fail)
HARMLESS = {
    ("code_adaptive", -1): "the instruction pointer is 2-byte units past co_code_adaptive: (d + 1) // 2 == d // 2",
    ("bytes_size", -1): "ob_size read one byte low is larger: the line table is cut to the bytes read, all of it",
}
OFFSETS = [f.name for f in dataclasses.fields(PythonLayout)
           if f.type in ("int", int) and f.name not in ("entry_kind", "instr_kind", "code_tag_mask", "entry_value")]


def test_every_interpreter_here_has_a_snapshot():
    """Each supported interpreter installed on this machine (pyenv's, Debian's) has its snapshot."""
    from pythons import SUPPORTED, interpreter

    installed = {f"python-{version}" for version in SUPPORTED if interpreter(version) is not None}
    assert installed <= set(SNAPSHOTS), f"make them: tests/replay/make_snapshot.py {sorted(installed - set(SNAPSHOTS))}"
    assert len(SNAPSHOTS) >= 7


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_replayed_stack_is_the_stored_one(replay, name):
    snapshot = load(name)
    got = replay_snapshot(replay, snapshot)
    assert [str(f) for f in got.frames] == [str(f) for f in snapshot.expected]
    assert got.frames == snapshot.expected
    assert (got.status, got.python_status) == (snapshot.status, snapshot.python_status)


def uses(layout: PythonLayout, field: str) -> bool:
    """Whether the walker or the naming reads ``field`` for this version (absent fields are -1, but two are
    kept at another field's value where the version has no such thing)."""
    if field == "code_adaptive":  # only where the frame's instruction is a pointer into co_code_adaptive
        return layout.instr_kind == INSTR_POINTER
    if field == "code_qualname":  # before 3.11 it is co_name's offset: there is no co_qualname
        return layout.code_qualname != layout.code_name
    return True


@pytest.mark.parametrize("field", OFFSETS)
def test_a_layout_field_off_by_one_changes_the_stack(replay, field):
    """Every offset the walker or the naming reads matters: moved by one byte (either way) in any snapshot whose
    interpreter has the field, the replayed stack is not the stored one."""
    tried = 0
    for name in SNAPSHOTS:
        snapshot = load(name)
        layout = snapshot.python_process().layout
        value = getattr(layout, field)
        if value < 0 or not uses(layout, field):
            continue
        for step in (-1, 1):
            moved = value + step
            if moved < 0 or (field, step) in HARMLESS:
                continue
            tried += 1
            try:
                got = replay_snapshot(replay, snapshot, dataclasses.replace(layout, **{field: moved}))
            except AssertionError:
                continue  # the sample was not even counted under one stack: a failure too
            assert got.frames != snapshot.expected, f"{name}: {field} {value} -> {moved} gave the same stack"
    assert tried, f"no snapshot has {field}"
