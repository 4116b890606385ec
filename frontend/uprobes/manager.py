"""Uprobes shared by consumers, keyed like the kernel keys them: (device, inode, file offset).

This mirrors the kernel's uprobe design (seed 003): one uprobe per key, any number of consumers on it,
each with its own filter; the first consumer of a key attaches it, the last one to leave detaches it,
and a consumer leaving never disturbs the others' counts. The kernel side is an injected
:class:`Attacher`, so this module runs (and is unit-tested) without BPF.

Counts live in the kernel per (probe id, pid) and are never reset while a probe is attached; a consumer
that joins an attached probe remembers the counts at that moment and reports what came after.

Memory stays bounded while processes come and go: every read hands over, once, the final rows of the
processes that exited (:attr:`KernelCounts.exited`, deleted from the kernel by then). Each consumer of
the probe gets them; at its next :meth:`ProbeManager.counts` its filter is applied (the same moment
live processes are judged), the calls join its per-probe exited total, and the pid is listed in
``per_pid`` until one count has shown it with no live process behind it, then dropped.

A key whose last consumer leaves while its uprobe_multi link still holds other live keys stays in the
kernel until the link's last key goes (ignored: nobody reads its id); see optrace.bpf.uprobes for why
the link is not swapped for one without it.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from optrace.errors import OptraceError
from optrace.model import CallCount
from optrace.frontend.uprobes.resolve import ProbeKey, ResolvedProbe
from optrace.probes import ExitedRow, KernelCounts, UnprobeableError, UprobeTarget

PidFilter = Callable[[int], bool]
SkipProbe = Callable[[ResolvedProbe, OptraceError], bool]


class Attacher(Protocol):
    """The kernel side: uprobes at (path, file offset), hits counted per (probe id, pid)."""

    def attach(self, targets: Sequence[UprobeTarget]) -> list[int | UnprobeableError]:
        """Attach a uprobe at each target; give back each one's probe id, or the UnprobeableError the
        kernel answered for it. Any other failure raises (a file replaced since it was checked, too),
        leaving none attached."""

    def detach(self, probe_ids: Collection[int]) -> None:
        """Stop counting these ids; their counts are dropped and the ids may come back from attach."""

    def read(self) -> KernelCounts:
        """The counts now; rows of exited processes come once in ``exited`` and are then forgotten."""

    def follow(self, root_pid: int) -> None:
        """Record ``root_pid`` and every process it forks from now on in :attr:`KernelCounts.followed`."""

    def close(self) -> None: ...


@dataclass
class _Attached:
    key: ProbeKey
    probe_id: int
    consumers: set[int] = field(default_factory=set)


@dataclass
class ExitedPid:
    """Calls of exited processes with one pid on one probe, listed until shown once with no live one."""

    calls: int
    comm: str
    shown: bool = False  # listed by a count already


@dataclass
class Consumer:
    """One user of probes (a count command, a record, an exporter's probe list)."""

    id: int
    probes: tuple[ResolvedProbe, ...]
    pid_filter: PidFilter | None
    baseline_totals: dict[ProbeKey, int] = field(default_factory=dict)
    baseline_lost: dict[ProbeKey, int] = field(default_factory=dict)
    baseline_per_pid: dict[tuple[ProbeKey, int], int] = field(default_factory=dict)
    pending_exits: list[tuple[ProbeKey, ExitedRow]] = field(default_factory=list)  # not yet filtered
    exited_calls: dict[ProbeKey, int] = field(default_factory=dict)  # accepted calls of exited processes
    exited_pids: dict[tuple[ProbeKey, int], ExitedPid] = field(default_factory=dict)  # still listed


class ProbeManager:
    """Attaches each (device, inode, offset) once, whatever the number of consumers and spellings."""

    def __init__(self, attacher_factory: Callable[[], Attacher]) -> None:
        self._factory = attacher_factory
        self._attacher: Attacher | None = None
        self._attached: dict[ProbeKey, _Attached] = {}
        self._consumers: dict[int, Consumer] = {}
        self._next_consumer = 1
        self._lock = threading.RLock()

    @property
    def attached_keys(self) -> set[ProbeKey]:
        return set(self._attached)

    def register(
        self, probes: Sequence[ResolvedProbe], pid_filter: PidFilter | None = None,
        skip_unprobeable: SkipProbe | None = None,
    ) -> Consumer:
        """Add a consumer; attach, in one batch, the keys nobody watches yet. All or nothing, except
        that probes the kernel refuses are left out when ``skip_unprobeable(probe, error)`` says so.
        A key named twice (a symlink, a hard link, overlapping globs) is one probe of the consumer, under
        the first SPEC that named it, so its calls are never counted twice in a sum."""
        with self._lock:
            new = list({p.key: p for p in probes if p.key not in self._attached}.values())
            refused = self._attach(new) if new else {}
            try:
                for key, error in refused.items():
                    refusing = [p for p in probes if p.key == key]
                    if skip_unprobeable is None or not all(skip_unprobeable(p, error) for p in refusing):
                        raise error
            except BaseException:
                self._detach([p.key for p in new if p.key not in refused])
                self._close_attacher_if_idle()
                raise
            first_spelling = {}
            for probe in probes:
                if probe.key not in refused:
                    first_spelling.setdefault(probe.key, probe)
            consumer = Consumer(id=self._next_consumer, pid_filter=pid_filter,
                                probes=tuple(first_spelling.values()))
            self._next_consumer += 1
            self._remember_baseline(consumer, {p.key for p in new})
            for probe in consumer.probes:
                self._attached[probe.key].consumers.add(consumer.id)
            self._consumers[consumer.id] = consumer
            return consumer

    def unregister(self, consumer: Consumer) -> None:
        """Remove a consumer (idempotent); keys it was the last one on are detached."""
        with self._lock:
            if self._consumers.pop(consumer.id, None) is None:
                return
            unused = []
            for key in {p.key for p in consumer.probes}:
                attached = self._attached[key]
                attached.consumers.discard(consumer.id)
                if not attached.consumers:
                    unused.append(key)
            self._detach(unused)
            self._close_attacher_if_idle()

    def counts(self, consumer: Consumer) -> list[CallCount]:
        """The consumer's calls since it registered, per probe, its filter applied."""
        with self._lock:
            kernel = self._read()
            rows = _rows_by_probe(kernel)
            self._take_exits(consumer)
            self._drop_shown_exits(consumer, rows)
            counts = [self._count_one(consumer, probe, kernel, rows) for probe in consumer.probes]
            for exited in consumer.exited_pids.values():
                exited.shown = True
            return counts

    def lost_rows(self) -> int:
        with self._lock:
            return sum(self._read().lost_rows.values())

    def follow(self, root_pid: int) -> None:
        with self._lock:
            if self._attacher is None:
                raise OptraceError("internal: follow() needs attached probes")
            self._attacher.follow(root_pid)

    def descendants(self, root_pid: int) -> set[int]:
        """``root_pid`` and the processes it forked since :meth:`follow`, exited ones included."""
        with self._lock:
            return {pid for pid, root in self._read().followed.items() if root == root_pid}

    def close(self) -> None:
        """Detach everything (idempotent): every consumer is gone afterwards."""
        with self._lock:
            for consumer in list(self._consumers.values()):
                self.unregister(consumer)
            self._close_attacher_if_idle()

    def _read(self) -> KernelCounts:
        """Every read goes through here, so no consumer misses the exited rows a read hands out."""
        if self._attacher is None:
            return KernelCounts()
        kernel = self._attacher.read()
        if kernel.exited:
            self._hand_out_exits(kernel.exited)
        return kernel

    def _hand_out_exits(self, exited: list[ExitedRow]) -> None:
        keys = {attached.probe_id: attached.key for attached in self._attached.values()}
        for row in exited:
            key = keys.get(row.probe_id)
            if key is None:
                continue
            for consumer_id in self._attached[key].consumers:
                self._consumers[consumer_id].pending_exits.append((key, row))

    def _take_exits(self, consumer: Consumer) -> None:
        """Judge the exits handed out since the last count: the filter applies now, like for live pids."""
        for key, row in consumer.pending_exits:
            since = row.calls - consumer.baseline_per_pid.pop((key, row.pid), 0)  # the oldest process is
            if not since or (consumer.pid_filter and not consumer.pid_filter(row.pid)):  # the one baselined
                continue
            consumer.exited_calls[key] = consumer.exited_calls.get(key, 0) + since
            listed = consumer.exited_pids.setdefault((key, row.pid), ExitedPid(calls=0, comm=row.comm))
            listed.calls += since
            listed.shown = False
        consumer.pending_exits.clear()

    def _drop_shown_exits(self, consumer: Consumer, rows: dict[int, dict[int, int]]) -> None:
        """Exited pids already shown at their final count are listed no more, unless a new process took
        the pid: then its predecessors stay in its entry, so between two consecutive counts a listed
        pid's count never goes down (what lets a consumer turn them into increments)."""
        for (key, pid), exited in list(consumer.exited_pids.items()):
            if exited.shown and pid not in rows.get(self._attached[key].probe_id, {}):
                del consumer.exited_pids[(key, pid)]

    def _attach(self, probes: list[ResolvedProbe]) -> dict[ProbeKey, UnprobeableError]:
        """Attach distinct new keys; return the ones the kernel refused (not attached)."""
        if self._attacher is None:
            self._attacher = self._factory()
        try:
            results = self._attacher.attach([UprobeTarget(p.binary, p.offset, p.key.dev, p.key.ino) for p in probes])
        except BaseException:
            self._close_attacher_if_idle()
            raise
        refused = {}
        for probe, result in zip(probes, results):
            if isinstance(result, UnprobeableError):
                refused[probe.key] = result
            else:
                self._attached[probe.key] = _Attached(key=probe.key, probe_id=result)
        return refused

    def _detach(self, keys: list[ProbeKey]) -> None:
        if keys:
            assert self._attacher is not None
            self._attacher.detach([self._attached.pop(key).probe_id for key in keys])

    def _close_attacher_if_idle(self) -> None:
        if not self._attached and self._attacher is not None:
            attacher, self._attacher = self._attacher, None
            attacher.close()

    def _remember_baseline(self, consumer: Consumer, new_keys: set[ProbeKey]) -> None:
        """Counts of probes other consumers already hold, so this consumer reports only what follows."""
        shared = {p.key for p in consumer.probes} - new_keys
        if not shared:
            return
        kernel = self._read()
        for key in shared:
            probe_id = self._attached[key].probe_id
            consumer.baseline_totals[key] = kernel.totals.get(probe_id, 0)
            consumer.baseline_lost[key] = kernel.lost_rows.get(probe_id, 0)
            for (pid_probe, pid), calls in kernel.per_pid.items():
                if pid_probe == probe_id:
                    consumer.baseline_per_pid[(key, pid)] = calls

    def _count_one(self, consumer: Consumer, probe: ResolvedProbe, kernel: KernelCounts,
                   rows: dict[int, dict[int, int]]) -> CallCount:
        probe_id = self._attached[probe.key].probe_id
        per_pid, comms = {}, {}
        for pid, calls in rows.get(probe_id, {}).items():
            if consumer.pid_filter and not consumer.pid_filter(pid):
                continue
            since = calls - consumer.baseline_per_pid.get((probe.key, pid), 0)
            if since:
                per_pid[pid] = since
                comms[pid] = kernel.comms.get(pid, "")
        live = sum(per_pid.values())
        for (key, pid), exited in consumer.exited_pids.items():
            if key == probe.key:
                per_pid[pid] = per_pid.get(pid, 0) + exited.calls
                comms.setdefault(pid, exited.comm)
        unattributed = 0
        if consumer.pid_filter is None:
            calls = kernel.totals.get(probe_id, 0) - consumer.baseline_totals.get(probe.key, 0)
            unattributed = kernel.lost_rows.get(probe_id, 0) - consumer.baseline_lost.get(probe.key, 0)
        else:
            calls = live + consumer.exited_calls.get(probe.key, 0)
        return CallCount(probe=probe.spec, binary=probe.binary, symbol=probe.symbol, offset=probe.offset,
                         calls=calls, per_pid=per_pid, comms=comms, unattributed=unattributed)


def _rows_by_probe(kernel: KernelCounts) -> dict[int, dict[int, int]]:
    """probe id -> pid -> calls of live processes."""
    rows: dict[int, dict[int, int]] = {}
    for (probe_id, pid), calls in kernel.per_pid.items():
        rows.setdefault(probe_id, {})[pid] = calls
    return rows
