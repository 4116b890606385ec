"""ProbeManager without BPF: an in-memory attacher stands in for the kernel."""
from __future__ import annotations

import pytest

from optrace.frontend.errors import OptraceError
from optrace.frontend.uprobes.manager import KernelCounts, ProbeManager, UnprobeableError
from optrace.frontend.uprobes.resolve import ProbeKey, ResolvedProbe


class FakeKernel:
    """Counts hits per (probe id, pid) like uprobe_count.c; records every attach and detach."""

    max_probes = 4

    def __init__(self) -> None:
        self.attached: dict[int, tuple[str, int]] = {}
        self.log: list[tuple[str, int]] = []
        self.rows: dict[tuple[int, int], int] = {}
        self.closed = False
        self.unprobeable: set[int] = set()
        self.broken: set[int] = set()

    def attach(self, targets):
        if any(offset in self.broken for _path, offset in targets):
            raise OptraceError("cannot set uprobes: broken")
        free = [i for i in range(self.max_probes) if i not in self.attached]
        results = []
        for path, offset in targets:
            if offset in self.unprobeable:
                results.append(UnprobeableError(f"cannot set a uprobe at offset {offset:#x}"))
                continue
            if not free:
                raise OptraceError(f"too many probes: at most {self.max_probes}")
            probe_id = free.pop(0)
            self.attached[probe_id] = (path, offset)
            self.log.append(("attach", offset))
            results.append(probe_id)
        return results

    def detach(self, probe_ids) -> None:
        for probe_id in probe_ids:
            path, offset = self.attached.pop(probe_id)
            self.rows = {k: v for k, v in self.rows.items() if k[0] != probe_id}
            self.log.append(("detach", offset))

    def hit(self, offset: int, pid: int, times: int = 1) -> None:
        """A process executes the probed instruction: counted only if a probe is attached there."""
        for probe_id, (_path, probe_offset) in self.attached.items():
            if probe_offset == offset:
                self.rows[(probe_id, pid)] = self.rows.get((probe_id, pid), 0) + times

    def read(self) -> KernelCounts:
        totals: dict[int, int] = {}
        for (probe_id, _pid), calls in self.rows.items():
            totals[probe_id] = totals.get(probe_id, 0) + calls
        return KernelCounts(totals=totals, per_pid=dict(self.rows), comms={pid: f"c{pid}" for _, pid in self.rows})

    def follow(self, root_pid: int) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def probe(offset: int, spec: str = "", ino: int = 7) -> ResolvedProbe:
    return ResolvedProbe(spec=spec or f"/bin/x:f{offset}", binary="/bin/x", symbol=f"f{offset}",
                         offset=offset, key=ProbeKey(1, ino, offset))


@pytest.fixture
def kernel():
    return FakeKernel()


@pytest.fixture
def manager(kernel):
    kernels = iter([kernel])
    return ProbeManager(lambda: next(kernels))


def calls(manager, consumer):
    return [c.calls for c in manager.counts(consumer)]


def test_first_consumer_attaches_last_detaches(manager, kernel):
    a = manager.register([probe(0x10)])
    b = manager.register([probe(0x10, spec="/link/to/x:f16")])  # another spelling, same key
    assert kernel.log == [("attach", 0x10)]
    manager.unregister(a)
    assert kernel.log == [("attach", 0x10)] and not kernel.closed
    manager.unregister(b)
    assert kernel.log == [("attach", 0x10), ("detach", 0x10)] and kernel.closed
    manager.unregister(b)  # idempotent
    assert len(kernel.log) == 2


def test_one_key_named_twice_by_one_consumer_attaches_once_and_counts_once(manager, kernel):
    consumer = manager.register([probe(0x20, "c:g"), probe(0x10, "a:f"), probe(0x10, "b:f")])
    kernel.hit(0x10, pid=5, times=3)
    assert kernel.log == [("attach", 0x20), ("attach", 0x10)]
    assert [(c.probe, c.calls) for c in manager.counts(consumer)] == [("c:g", 0), ("a:f", 3)]


def test_late_consumer_counts_only_what_follows(manager, kernel):
    early = manager.register([probe(0x10)])
    kernel.hit(0x10, pid=5, times=10)
    late = manager.register([probe(0x10)])
    kernel.hit(0x10, pid=5, times=2)
    kernel.hit(0x10, pid=6, times=1)
    assert calls(manager, early) == [13]
    assert calls(manager, late) == [3]
    assert manager.counts(late)[0].per_pid == {5: 2, 6: 1}


def test_leaving_consumer_does_not_disturb_others(manager, kernel):
    a = manager.register([probe(0x10), probe(0x20)])
    b = manager.register([probe(0x20)])
    kernel.hit(0x20, pid=5, times=4)
    manager.unregister(a)
    assert ("detach", 0x10) in kernel.log and ("detach", 0x20) not in kernel.log
    kernel.hit(0x20, pid=5, times=1)
    kernel.hit(0x10, pid=5, times=100)  # no longer probed: not counted anywhere
    assert calls(manager, b) == [5]


def test_filters_are_per_consumer(manager, kernel):
    everyone = manager.register([probe(0x10)])
    only_6 = manager.register([probe(0x10)], pid_filter=lambda pid: pid == 6)
    kernel.hit(0x10, pid=5, times=2)
    kernel.hit(0x10, pid=6, times=3)
    assert calls(manager, everyone) == [5]
    only = manager.counts(only_6)[0]
    assert (only.calls, only.per_pid, only.comms) == (3, {6: 3}, {6: "c6"})


def test_failed_attach_attaches_nothing_new(manager, kernel):
    kept = manager.register([probe(0x10)])
    kernel.broken.add(0x30)
    with pytest.raises(OptraceError, match="broken"):
        manager.register([probe(0x10), probe(0x20), probe(0x30)])
    assert kernel.log == [("attach", 0x10)]
    assert manager.attached_keys == {probe(0x10).key}
    kernel.hit(0x10, pid=1)
    assert calls(manager, kept) == [1]


def test_unprobeable_probes_fail_the_register_unless_skipped(manager, kernel):
    kernel.unprobeable.add(0x30)
    with pytest.raises(UnprobeableError, match="0x30"):
        manager.register([probe(0x20), probe(0x30)])
    assert kernel.log == [("attach", 0x20), ("detach", 0x20)] and kernel.closed
    skipped = []
    consumer = ProbeManager(lambda: kernel).register(
        [probe(0x20), probe(0x30)], skip_unprobeable=lambda p, error: skipped.append(p.offset) or True)
    assert skipped == [0x30] and [p.offset for p in consumer.probes] == [0x20]


def test_probe_ids_are_reused_and_bounded(manager, kernel):
    consumers = [manager.register([probe(offset)]) for offset in (1, 2, 3, 4)]
    with pytest.raises(OptraceError, match="at most 4"):
        manager.register([probe(5)])
    manager.unregister(consumers[1])
    manager.register([probe(5)])
    assert set(kernel.attached) == {0, 1, 2, 3}


def test_close_detaches_everything(manager, kernel):
    manager.register([probe(1)])
    manager.register([probe(2), probe(1)])
    manager.close()
    assert kernel.attached == {} and kernel.closed
    assert manager.attached_keys == set()
