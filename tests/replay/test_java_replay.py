"""HotSpot frames replayed on stored snapshots of JDK 17 and 25 (snapshots/java-*, made by
make_java_snapshot.py): the user-space reference walk (frontend/runtimes/hotspot/walker.py, the rules the BPF
walker will follow) over the snapshot's memory gives the stored frames: compiled frames with inlined methods
expanded, the lambda comparator under Arrays.sort, interpreted main, (the -vm snapshots) a thread in the VM or
native code walked from its last Java frame, and (-upcall, interpreted) a walk through an entry frame where
the VM linking the lambda called Java. Every offset of the layout moved by one byte changes a
replayed stack, and no moved layout makes the walk raise."""
from __future__ import annotations

import dataclasses

import pytest

from javasnapshots import load_java, process_of, replay_java
from optrace.frontend.runtimes.hotspot.layout import Bound
from snapshots import names

SNAPSHOTS = names("java-")
# (field, step) that cannot change a stack, and why
HARMLESS = {
    ("blob_size", -1): "a bound the code must lie within, not read for a name",
    ("nmethod_compile_id", -1): "the debug information's cache key (the BPF walker's frame cookie, docs/runtimes.md)",
    ("nmethod_compile_id", 1): "the debug information's cache key (the BPF walker's frame cookie, docs/runtimes.md)",
    ("blob_frame_complete", -1): "it orders the ways a leaf's caller is read; each is checked (walker.py)",
    ("blob_frame_complete", 1): "it orders the ways a leaf's caller is read; each is checked (walker.py)",
    ("code_blob", -1): "a read length: one byte less still covers every field read",
    ("code_blob", 1): "a read length",
    ("nmethod", -1): "a read length: one byte less still covers every field read",
    ("nmethod", 1): "a read length",
}


def test_both_jdks_have_snapshots():
    assert SNAPSHOTS == [f"java-{jdk}{kind}" for jdk in ("17", "25") for kind in ("", "-upcall", "-vm")]


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_replayed_java_stack_is_the_stored_one(name):
    snapshot = load_java(name)
    got = replay_java(snapshot)
    assert [str(f) for f in got.frames] == [str(f) for f in snapshot.expected]
    assert (got.frames, got.status, got.from_anchor, got.upcalls) == \
        (snapshot.expected, snapshot.status, snapshot.from_anchor, snapshot.upcalls)
    names_ = [f.name for f in got.frames]
    assert names_[-1] == "Phases.main"
    if name.endswith("-upcall"):
        assert got.upcalls and {f.kind for f in got.frames} == {"interpreted"}
    elif not snapshot.from_anchor:
        assert names_.index("Phases.lambda$sortPhase$0") < names_.index("java.util.Arrays.sort")
        assert any(f.kind == "inlined" for f in got.frames) and any(f.kind == "compiled" for f in got.frames)


def moved_layouts(layout):
    """(what moved, the layout with it moved one byte either way) for every offset the layout holds."""
    for field, found in layout.fields.items():
        for step in (-1, 1):
            moved = dict(layout.fields, **{field: dataclasses.replace(found, offset=found.offset + step)})
            yield (field, step), dataclasses.replace(layout, fields=moved)
    for part, bounds in layout.nmethod_data.items():
        for end, bound in enumerate(bounds):
            for step in (-1, 1):
                changed = list(bounds)
                changed[end] = Bound(bound.base, dataclasses.replace(bound.field, offset=bound.field.offset + step))
                yield (f"{part}[{end}]", step), dataclasses.replace(layout, nmethod_data={**layout.nmethod_data,
                                                                                           part: tuple(changed)})
    for table in ("sizes", "interpreter_frame", "ints"):
        for key, held in getattr(layout, table).items():
            for step in (-1, 1):
                yield (key, step), dataclasses.replace(layout, **{table: {**getattr(layout, table), key: held + step}})


def test_every_layout_offset_off_by_one_changes_a_stack():
    snapshots = [load_java(name) for name in SNAPSHOTS]
    unchanged: dict[tuple, int] = {}
    for snapshot in snapshots:
        for what, layout in moved_layouts(process_of(snapshot).layout):
            got = replay_java(snapshot, layout)  # must not raise, whatever it reads
            same = (got.frames, got.status) == (snapshot.expected, snapshot.status)
            unchanged[what] = unchanged.get(what, 0) + same
    never = sorted(what for what, count in unchanged.items() if count == len(snapshots) and what not in HARMLESS)
    assert not never, f"moved by one byte, these changed no stack: {never}"
    assert not [what for what in HARMLESS if unchanged.get(what, len(snapshots)) < len(snapshots)], \
        "a move said to be harmless changed a stack: take it out of HARMLESS"
