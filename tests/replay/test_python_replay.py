"""The BPF Python walker (bpf/python.c over bpf/unwind.c) replayed on stored snapshots of CPython 3.8-3.13,
Debian's 3.11 and Debian sid's 3.14 and 3.15 (snapshots/, made by make_snapshot.py): the stack the kernel's
rules give from the snapshot's registers and memory, named as frontend/runtimes/cpython/ names it, is the stack stored
with the snapshot, and the interpreter's thread list is the process's threads. No timing, no BPF load, no live
process: the walker's correctness on every interpreter at every run, and every layout offset and every
_Py_DebugOffsets shape (3.13+) one step off is seen."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from optrace.frontend.runtimes.cpython import interpreter
from optrace.frontend.runtimes.cpython.debugoffsets import READ_SIZE, parse_debug_offsets, shape_size
from optrace.frontend.runtimes.cpython.debugshapes import SHAPES, Shape
from optrace.pythonlayout import INSTR_POINTER, PythonLayout
from snapshots import Snapshot, load, names, replay_snapshot, snapshot_thread_problem

SNAPSHOTS = names()
SELF_DESCRIBED = [name for name in SNAPSHOTS if int(name.split("-")[1].split(".")[1]) >= 13]  # _Py_DebugOffsets
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
    assert {f"python-{version}" for version in SUPPORTED} <= set(SNAPSHOTS)  # stored, whatever this machine has


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_replayed_stack_is_the_stored_one(replay, name):
    snapshot = load(name)
    got = replay_snapshot(replay, snapshot)
    assert [str(f) for f in got.frames] == [str(f) for f in snapshot.expected]
    assert got.frames == snapshot.expected
    assert (got.status, got.python_status) == (snapshot.status, snapshot.python_status)


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_thread_list_is_the_processs_threads(name):
    """The interpreter's thread states read from the snapshot (the reference walker's list) are the process's
    threads when it was stopped: as many, by kernel tid (3.11+), the stopped one with its pthread id."""
    assert snapshot_thread_problem(load(name)) is None


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


def shape_mutations(shape: Shape) -> Iterator[tuple[str, Shape]]:
    """The wrong shapes one member away from ``shape``: each member dropped (the headers have one the shape lacks),
    one more before it (the shape has one the headers lack), swapped with the next in its group."""
    for g, (group, members) in enumerate(shape):
        def with_members(new: tuple[str, ...]) -> Shape:
            return (*shape[:g], (group, new), *shape[g + 1:])
        for i, member in enumerate(members):
            yield f"{group}.{member} dropped", with_members(members[:i] + members[i + 1:])
            yield f"one more before {group}.{member}", with_members((*members[:i], "_more", *members[i:]))
            if i + 1 < len(members):
                yield (f"{group}.{member} swapped with {members[i + 1]}",
                       with_members((*members[:i], members[i + 1], member, *members[i + 2:])))


def derived(snapshot: Snapshot, minor: int):
    """What today's shape of ``minor`` derives from the snapshot's _Py_DebugOffsets: (layout, thread offsets),
    or the refusal."""
    parsed = parse_debug_offsets(snapshot.memory().read(snapshot.python["runtime"], shape_size(SHAPES[minor])),
                                 (3, minor))
    return parsed if isinstance(parsed, str) else (parsed.layout, parsed.threads)


@pytest.mark.parametrize("name", SELF_DESCRIBED)
def test_a_wrong_debug_offsets_shape_is_seen(replay, monkeypatch, name):
    """A shape of _Py_DebugOffsets one member off (debugshapes.py made from the wrong headers, or edited by hand)
    that changes what is derived from the interpreter's table is refused (by the fixed facts, the layout check or
    a member the code names missing), or changes the replayed stack or the thread list."""
    snapshot = load(name)
    minor = snapshot.python["minor"][1]
    right = derived(snapshot, minor)
    assert not isinstance(right, str), right
    tried = 0
    for what, shape in shape_mutations(SHAPES[minor]):
        monkeypatch.setitem(SHAPES, minor, shape)
        monkeypatch.setattr(interpreter, "READ_SIZE", max(READ_SIZE, shape_size(shape)))
        try:
            if derived(snapshot, minor) == right:
                continue  # a member nothing reads: the same layout
            tried += 1
            got, threads = replay_snapshot(replay, snapshot), snapshot_thread_problem(snapshot)
        except (AssertionError, KeyError):
            continue  # refused, or the code names a member the shape lacks
        assert got.frames != snapshot.expected or threads, f"{name}: {what}: the same stack and threads"
    assert tried >= 30, f"{name}: {tried} shapes changed the layout"
