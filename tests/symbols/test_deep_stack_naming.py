"""Deep stacks named by :meth:`Symbolizer.symbolize`: each distinct frame of a process is named once, frames named
before are looked up in C (issue 42: a 400-deep recursion's stacks made the per-frame loop most of the record
built after the window), and a raw address is still named as of each sample's time (JIT code changes).

An equivalence guard of the C lookups (it passes on main too): the ids of every row are the names the per-frame
naming gives, for stacks whose frames repeat within themselves, across stacks and across processes."""
from __future__ import annotations

from optrace.frontend.symbols.symbolizer import Symbolizer
from optrace.model import RUNTIME_FRAME, Frame, RawSample, UserFrame

DEPTH = 300


def _named(pid: int, word: int) -> Frame:
    return Frame(f"f{word}", f"/{pid}.py", kind="cpython", line=word)


def _recursion(pid: int, depth: int, leaf: int, time: float = 0.0) -> RawSample:
    """A recursion ``depth`` deep (the same two frames over and over), under a leaf of its own."""
    frames = [UserFrame(RUNTIME_FRAME, 1000 + leaf)] + [UserFrame(RUNTIME_FRAME, 1 + i % 2) for i in range(depth)]
    return RawSample(pid, "py", tuple(frames), (), 1, time)


def test_deep_stacks_name_each_frame_once_and_every_row_as_the_per_frame_naming():
    looked: list[tuple[int, int]] = []
    symbolizer = Symbolizer(debug_roots=(), runtime_lookup=lambda pid, word: looked.append((pid, word))
                            or _named(pid, word))
    samples = [_recursion(pid, depth, depth % 7) for pid in (10, 11) for depth in range(1, DEPTH)]
    frames, rows = symbolizer.symbolize(samples)
    assert sorted(looked) == sorted({(s.pid, f.offset) for s in samples for f in s.user})
    for sample, row in zip(samples, rows, strict=True):
        assert [frames[i] for i in row.frames] == [_named(sample.pid, f.offset) for f in sample.user]


def test_a_raw_address_is_named_as_of_each_samples_time():
    symbolizer = Symbolizer(debug_roots=(), runtime_lookup=_named)
    named_at: list[float] = []

    def jit(pid: int, address: int, time: float) -> tuple[str, str]:
        named_at.append(time)
        return f"jit@{time}", "map"

    symbolizer._lookup_jit = jit
    raw = UserFrame(None, 0x7000)
    samples = [RawSample(12, "js", (raw, UserFrame(RUNTIME_FRAME, 1)), (), 1, time) for time in (1.0, 2.0, 2.0)]
    frames, rows = symbolizer.symbolize(samples)
    assert named_at == [1.0, 2.0]
    assert [frames[row.frames[0]].symbol for row in rows] == ["jit@1.0", "jit@2.0", "jit@2.0"]
