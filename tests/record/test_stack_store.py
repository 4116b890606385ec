"""The stack store under a real sampler (bpf/stackstore.c, real BPF): a stack is copied once per store
epoch however often it is sampled, and a store much smaller than the stacks of a recording turns over
without losing one."""
from __future__ import annotations

import pytest

from optrace.frontend.recorder import Recorder, RecordOptions
from optrace.model import Record
from support import WORKLOADS, leaf_samples

pytestmark = pytest.mark.usefixtures("bpf_ready")


def recorded(argv: list[str], **options) -> tuple[Record, Recorder]:
    recorder = Recorder(RecordOptions(command=argv, **options))
    return recorder.run(), recorder


def test_a_small_store_turns_over_and_keeps_every_stack():
    """A store sized for 256 stacks, fed ~1,000 new stacks a CPU second (workloads/stacks, 3 s of its CPU
    time: by wall time, a machine at load 30 gave it 0.07 s and the store never filled): it turns over at
    every drain, and no sample loses its stack; the leaf the workload burns in is ~every sample's."""
    record, recorder = recorded([str(WORKLOADS / "stacks"), "3", "1", "0", "cpu"], frequency_hz=999,
                                stack_storage_size=256)
    store = recorder.session.profiler.store
    assert store.stats["turnovers"] >= 2, store.stats
    assert not {reason: n for reason, n in record.meta.lost.items() if "stack" in reason}, record.meta.lost
    found = leaf_samples(record, "stacks")
    total = sum(found.values())
    assert total > 0.8 * 3 * 999 and found["leaf_burn"] > 0.95 * total, found
    assert len({s.frames for s in record.samples if s.comm == "stacks"}) > 1000  # distinct stacks kept


def test_a_stack_sampled_again_is_not_copied_again():
    """workloads/shares burns in two functions under one call path: two user stacks (and a few kernel
    ones) for ~2,000 samples, so the store holds a few records' words, not a record per sample."""
    record, recorder = recorded([str(WORKLOADS / "shares"), "50", "2"], frequency_hz=999)
    samples = sum(s.count for s in record.samples if s.comm == "shares")
    words = recorder.session.profiler.store.stats["words"]
    assert samples > 1500 and words < 2 * samples, (samples, recorder.session.profiler.store.stats)
    assert abs(leaf_samples(record, "shares")["share_a"] / samples - 0.5) < 0.05
