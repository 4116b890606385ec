"""offcpu.py's drain against a stand-in for the BPF maps (no BCC, no root): the order in which it looks
at waiting threads, reads the sums and clears stacks, with a wait that ends in the middle of the drain."""
from __future__ import annotations

from types import SimpleNamespace

from optrace.bpf.offcpu import OffCpuTracer

WAITER_STACK = 7


class Table(dict):
    """A BPF table as BCC shows it, enough for the drain."""

    Key = staticmethod(lambda value: SimpleNamespace(value=value))
    Leaf = staticmethod(lambda value: value)

    def __setitem__(self, key, value) -> None:
        super().__setitem__(getattr(key, "value", key), value)

    def __getitem__(self, key):
        return super().__getitem__(getattr(key, "value", key))

    def __delitem__(self, key) -> None:
        super().__delitem__(getattr(key, "value", key))

    def keys(self):
        return [SimpleNamespace(value=k) for k in super().keys()]


def waiter_key(set_index: int) -> SimpleNamespace:
    return SimpleNamespace(set=set_index, pid=10, tid=11, user_stack_id=WAITER_STACK, kernel_stack_id=-14,
                           comm=b"mutex_waiter")


class Maps(dict):
    """The maps with one thread off CPU since before the last flip (its stack is in set 0); its wait
    ends while the drain reads the sums: the sum is added, then its entry goes, as offcpu.c does."""

    def __init__(self) -> None:
        super().__init__({b"active": Table(), b"start": Table({11: SimpleNamespace(key=waiter_key(0))}),
                          b"ustacks0": Table({WAITER_STACK: SimpleNamespace(ip=[0x401000, 0x401100, 0])}),
                          b"kstacks0": Table(), b"ustacks1": Table(), b"kstacks1": Table()})
        self.counts = []
        self[b"counts"] = SimpleNamespace(items_lookup_and_delete_batch=self._read_counts)

    def _read_counts(self):
        read, self.counts = self.counts, []
        if self[b"start"]:  # the wait ends now: after the read
            self.counts.append((waiter_key(0), 360_000_000))
            del self[b"start"][11]
        return read


def test_a_wait_ending_during_the_drain_keeps_its_stack_for_the_next():
    tracer = OffCpuTracer(pids=[10])
    tracer._bpf = Maps()
    tracer._read_lost = lambda: {}
    assert tracer.drain().samples == []
    later = tracer.drain().samples  # the sum added during the first drain
    assert [(s.comm, s.count, [f.offset for f in s.user]) for s in later] == \
        [("mutex_waiter", 360_000_000, [0x401000, 0x401100])]
