"""CallCounter: what `optrace count`, `optrace record --uprobe` and the exporter use to count calls.

Every CallCounter of a process is a consumer of one shared :class:`ProbeManager`, so two users of the
same function (say a record and the exporter) share one uprobe and still get their own counts.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from optrace.errors import OptraceError
from optrace.frontend.preflight import require_recording
from optrace.frontend.report.callcounts import ProbeCalls
from optrace.frontend.uprobes.manager import Attacher, Consumer, PidFilter, ProbeManager
from optrace.frontend.uprobes.resolve import (DEFAULT_MAX_MATCHES, Resolution, ResolvedProbe, name_list,
                                              resolve_specs)
from optrace.frontend.uprobes.spec import parse_spec
from optrace.model import CallCount

_shared: ProbeManager | None = None
_shared_lock = threading.Lock()


def _bpf_attacher() -> Attacher:
    from optrace.bpf.uprobes import BpfUprobeAttacher

    return BpfUprobeAttacher()


def shared_manager() -> ProbeManager:
    """The process's ProbeManager, attaching through BPF (created on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ProbeManager(_bpf_attacher)
        return _shared


class CallCounter:
    """Exact call counts of the functions the SPECs name, in processes ``pid_filter`` accepts (all by default).

    What :meth:`calls` returns, one :class:`CallCount` per probe, all counted since :meth:`start`:

    - ``calls`` is the exact cumulative total: every call counts once, whether its process still runs,
      has exited, or could not get a per-pid row in the kernel (those are also in ``unattributed``,
      a kernel counter of their own; see :meth:`lost_rows`).
    - ``per_pid`` holds each live process, and each exited process once more, with its final count,
      in the first :meth:`calls` after its exit was seen; later results no longer list it (its calls
      stay in ``calls``). This is what keeps memory bounded, in the kernel and here, however many
      processes come and go. A pid taken by a new process while the old one is still listed keeps one
      entry, the sum of both: from one result to the next a pid's entry never decreases, and a pid
      absent from a result starts again from 0 if it comes back (what serve's CallSource relies on).
    - ``pid_filter`` is asked about an exited process at that first :meth:`calls` after its exit, so it
      must still accept the pid then (optrace's filters only ever grow).

    The kernel's rows of exited processes are taken out at every read (:meth:`calls`, :meth:`lost_rows`,
    any consumer's) and kept for each consumer until its next :meth:`calls`: call it regularly (serve
    does, every drain) for memory to stay bounded; one that reads only at its end (record) keeps them
    until then, as the kernel did before.
    """

    def __init__(
        self,
        specs: Sequence[str],
        pid_filter: Callable[[int], bool] | None = None,
        max_matches: int = DEFAULT_MAX_MATCHES,
        manager: ProbeManager | None = None,
        pids: Sequence[int] = (),
    ) -> None:
        self.specs = tuple(specs)
        self.pids = tuple(pids)  # -p: a program or library name is taken as these processes map it
        self.pid_filter: PidFilter | None = pid_filter
        self.max_matches = max_matches
        self.resolution: Resolution | None = None
        self._manager = manager
        self._consumer: Consumer | None = None
        self._skipped: list[str] = []

    @property
    def manager(self) -> ProbeManager:
        if self._manager is None:
            self._manager = shared_manager()
        return self._manager

    @property
    def warnings(self) -> list[str]:
        """Resolution warnings (IFUNCs) and, after start(), glob matches the kernel could not probe."""
        found = self.resolution.warnings if self.resolution else []
        if not self._skipped:
            return list(found)
        return [*found, f"skipped {name_list(self._skipped)}: the kernel refuses a uprobe on the first instruction"]

    @property
    def probes(self) -> tuple[ResolvedProbe, ...]:
        """The attached probes, in the order of :meth:`calls` (glob matches the kernel refused left out)."""
        if self._consumer is None:
            raise OptraceError("internal: CallCounter.probes before start()")
        return self._consumer.probes

    def resolve(self) -> Resolution:
        """Resolve the SPECs (idempotent); bad input raises OptraceError here, before any attach."""
        if self.resolution is None:
            if not self.specs:
                raise OptraceError("no probe given: name at least one BINARY:SYMBOL (e.g. c:malloc)")
            self.resolution = resolve_specs(self.specs, self.max_matches, self.pids)
        return self.resolution

    def start(self) -> None:
        resolution = self.resolve()
        if self._consumer is not None:
            return
        if self._manager is None:
            require_recording(uprobes=True)  # tracefs too: BCC reads the fork tracepoint's format there
        self._consumer = self.manager.register(resolution.probes, self.pid_filter, self._skip_glob_match)

    def _skip_glob_match(self, probe: ResolvedProbe, error: OptraceError) -> bool:
        """A glob may match functions the kernel cannot probe: leave those out; a named one is an error."""
        if parse_spec(probe.spec).is_glob:
            self._skipped.append(probe.symbol)
            return True
        return False

    def calls(self) -> list[CallCount]:
        if self._consumer is None:
            raise OptraceError("internal: CallCounter.calls() before start()")
        return self.manager.counts(self._consumer)

    def probe_calls(self) -> list[ProbeCalls]:
        """:meth:`calls`, each with its probe: what `optrace count` prints."""
        return [ProbeCalls(probe.spec, probe.binary, probe.symbol, probe.offset, probe.aliases,
                           parse_spec(probe.spec).is_glob, count)
                for probe, count in zip(self.probes, self.calls())]

    def lost_rows(self) -> int:
        """Hits not attributed to a pid because the kernel's per-process maps were full (totals stay exact)."""
        return self.manager.lost_rows() if self._consumer is not None else 0

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            self.manager.unregister(consumer)

    def __enter__(self) -> CallCounter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
