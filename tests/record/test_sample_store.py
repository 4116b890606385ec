"""The recorder's SampleStore: samples summed over drains; folded CFI stacks (counted as the map gave
them) decoded once at the end and merged with the same stacks that came decoded."""
from __future__ import annotations

from dataclasses import dataclass

from optrace.bpf.unwindmaps import UnwoundStack
from optrace.frontend.recorder import SampleStore
from optrace.model import RawSample, UserFrame

FRAMES = (UserFrame(b"a" * 20, 0x10), UserFrame(b"b" * 20, 0x20))


@dataclass(frozen=True)
class Folded:
    """Stands for bpf.unwindmaps.FoldedStack: decoded only when the store's samples are asked for."""

    words: bytes

    def decoded(self) -> UnwoundStack:
        decodes.append(self.words)
        return UnwoundStack(FRAMES, "outermost")


decodes: list[bytes] = []


def test_folded_stacks_are_decoded_once_and_merge_with_decoded_ones():
    decodes.clear()
    store = SampleStore()
    store.add(RawSample(1, "app", FRAMES, (), 2, 5.0, tid=3, stop="outermost"), timed=False)
    store.add_folded({(1, "app", Folded(b"x"), (), 3): 5, (1, "app", Folded(b"x"), (0xffff1,), 3): 4})
    store.add_folded({(1, "app", Folded(b"x"), (), 3): 1})  # the next drain
    assert decodes == []
    assert sorted(store.samples(), key=lambda s: s.count) == [
        RawSample(1, "app", FRAMES, (0xffff1,), 4, tid=3, stop="outermost"),
        RawSample(1, "app", FRAMES, (), 8, tid=3, stop="outermost")]
    assert decodes == [b"x", b"x"]  # once per distinct key
