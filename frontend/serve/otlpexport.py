"""`optrace serve`'s OTLP push: one profile of whole stacks per interval, sent by a thread of its own.

The drain loop hands each drain's whole stacks (named as for a /debug/pprof/profile window: the daemon
asks for them whenever push is on) to :meth:`OtlpExporter.drained`, which adds them to the interval's
stack table (frontend/serve/stacktable.py, bounded as a window is) and, for each process new to the
interval, reads its resource attributes from /proc (frontend/serve/otlpresource.py). Once the interval
(5 s by default, the OTel eBPF profiler's) has passed, the drain loop encodes it (exporters/otlp.py:
CPU samples, and with --off-cpu the off-CPU time, each its own sample type) and puts the request in
the bounded queue (frontend/serve/otlpqueue.py); it never waits for the network.

The sender thread sends the oldest request and, on a retryable answer (frontend/serve/otlptransport.py),
tries it again after an exponential backoff with jitter: 1 s, doubling, at most 30 s, each delay drawn
between half and one and a half of it (the OpenTelemetry Collector's exporter backs off the same way;
its cap is 30 s), or after the delay the server asked for (RetryInfo, Retry-After). A request still
failing 5 minutes after it was made (the Collector's max elapsed time) is dropped, and so is one the
server refused for good; the queue drops the oldest when a new one would pass its bound. Each outcome is
a self-metric on /metrics (``optrace_otlp_*``). A try ends with ``--otlp-timeout`` however the receiver
answers (otlptransport.py: a trickling one included), as a retryable failure. When requests have waited
FAILING_WARN_S with none sent (a minute), a warning says so, once until a request is sent again. At exit the last interval is sent, for at most 5 s.
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from optrace import __version__
from optrace.exporters.otlp import Attribute, Resources, encode
from optrace.frontend.report.events import without_tracepoint_frames
from optrace.frontend.serve.metricspage import counted_by
from optrace.frontend.serve.otlpconfig import OtlpOptions
from optrace.frontend.serve.otlpqueue import QueuedRequest, RequestQueue
from optrace.frontend.serve.otlpresource import host_attributes, process_attributes
from optrace.frontend.serve.otlptransport import RETRY_CAP_S, SendResult, Transport, make_transport
from optrace.frontend.serve.stacktable import StackKey, StackTable
from optrace.frontend.serve.totals import Delta
from optrace.model import Frame, Record, RecordMeta, Sample

INITIAL_RETRY_S = 1.0
RETRY_JITTER = 0.5  # each delay is drawn in [1 - this, 1 + this] times the backoff
MAX_RETRY_ELAPSED_S = 300.0  # a request is dropped this long after it was made
MAX_REQUEST_BYTES = 64 << 20  # the spec's recommended client limit: a larger request is not sent
FLUSH_S = 5.0  # at exit: how long the last requests may take
FAILING_WARN_S = 60.0  # the oldest waiting request has waited this long: a warning
INTERVAL_MAX_STACKS = 100_000  # per event, as a /debug/pprof/profile window
INTERVAL_MAX_FRAMES = 200_000
# outcome of a request, once done with: the label values of optrace_otlp_requests_total
OUTCOMES = ("sent", "rejected", "dropped_queue_full", "dropped_retries", "dropped_too_large")


def backoff(attempts: int, draw: Callable[[float, float], float] = random.uniform) -> float:
    """The wait before try ``attempts + 1``: 1 s doubling up to the cap, with ±50 % jitter."""
    delay = min(INITIAL_RETRY_S * 2 ** max(attempts - 1, 0), RETRY_CAP_S)
    return delay * draw(1 - RETRY_JITTER, 1 + RETRY_JITTER)


@dataclass
class _Interval:
    started_wall: float
    started: float  # monotonic
    table: StackTable = field(default_factory=lambda: StackTable(INTERVAL_MAX_STACKS, INTERVAL_MAX_FRAMES))
    off_cpu: Counter[StackKey] = field(default_factory=Counter)
    processes: dict[int, tuple[Attribute, ...]] = field(default_factory=dict)

    def add(self, stacks: tuple[list[Frame], list[Sample]] | None, counts: Counter[StackKey] | None = None) -> None:
        if stacks is None:
            return
        frames, samples = stacks
        self.table.add(frames, samples, counts)
        for sample in samples:
            if sample.pid not in self.processes:
                self.processes[sample.pid] = process_attributes(sample.pid) if sample.pid else ()


@dataclass
class OtlpStats:
    """The self-metrics, changed under ``lock`` by the drain loop and the sender."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Counter[str] = field(default_factory=Counter)  # outcome -> requests
    samples: Counter[str] = field(default_factory=Counter)  # outcome -> CPU samples in those requests
    retries: Counter[str] = field(default_factory=Counter)  # reason (gRPC code, "http 503", "connection")
    sent_bytes: int = 0
    rejected_profiles: int = 0  # partial successes' count of profiles the backend did not keep
    encode_seconds: float = 0.0

    def done(self, request: QueuedRequest, outcome: str) -> None:
        with self.lock:
            self.requests[outcome] += 1
            self.samples[outcome] += request.samples
            if outcome == "sent":
                self.sent_bytes += request.size


class OtlpExporter:
    def __init__(self, options: OtlpOptions, frequency_hz: int,
                 transport: Callable[[OtlpOptions], Transport] = make_transport,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.options = options
        self._frequency_hz = frequency_hz
        self._make_transport = transport
        self._transport: Transport | None = None
        self._clock, self._wall = clock, wall
        self.queue = RequestQueue(options.queue_bytes)
        self.stats = OtlpStats()
        self._resources_host = host_attributes(options.resource_attributes)
        self._interval = _Interval(wall(), clock())
        self._sending: QueuedRequest | None = None
        self._failing = False
        self._last_failure = ""  # the last failed try's reason and message, for the warning
        self._sent_at = clock()  # the last request sent
        self._waiting_since: float | None = None  # requests have been waiting since (the drain loop's view)
        self._warned_failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warnings: list[str] = []
        self._warnings_lock = threading.Lock()

    # -- the drain loop's side ---------------------------------------------------------------------------
    def start(self) -> None:
        self._transport = self._make_transport(self.options)
        self._interval = _Interval(self._wall(), self._clock())
        self._thread = threading.Thread(target=self._send_loop, name="otlp-export", daemon=True)
        self._thread.start()

    def drained(self, delta: Delta) -> None:
        """One drain's whole stacks into the interval; an interval that has passed is queued."""
        interval = self._interval
        interval.add(delta.stacks)
        if delta.off_cpu_stacks is not None:
            frames, samples = delta.off_cpu_stacks
            interval.add((frames, without_tracepoint_frames(frames, samples)), interval.off_cpu)
        now = self._clock()
        if now - interval.started >= self.options.interval_s:
            self._finish(now)
        self._watch_failures(now)

    def _watch_failures(self, now: float) -> None:
        """A warning, once until a request is sent again, when requests have been waiting FAILING_WARN_S with
        none sent: whatever the tries (failed, or one that never ends under --otlp-timeout 0)."""
        if not len(self.queue):
            self._waiting_since = None
            return
        if self._waiting_since is None:
            self._waiting_since = now
        stalled = now - max(self._waiting_since, self._sent_at)
        if self._warned_failing or stalled < FAILING_WARN_S:
            return
        self._warned_failing = True
        with self.stats.lock:
            retries = sum(self.stats.retries.values())
        self._warn(f"OTLP export to {self.options.endpoint}: nothing sent for {stalled:.0f} s ({len(self.queue)} "
                   f"requests waiting, {retries} tries retried; last: {self._last_failure or 'a try still running'})")

    def _finish(self, now: float) -> None:
        interval, self._interval = self._interval, _Interval(self._wall(), now)
        cpu = [Sample(pid, comm, frames, count) for (pid, comm, frames), count in interval.table.stacks.items()]
        off_cpu = [Sample(pid, comm, frames, count) for (pid, comm, frames), count in interval.off_cpu.items()]
        if not cpu and not off_cpu:
            return  # nothing sampled: no empty profile is sent (nor is one by the OTel profiler)
        started = time.perf_counter()
        meta = RecordMeta(optrace_version=__version__, hostname=dict(self._resources_host).get("host.name", ""),
                          kernel="", started=interval.started_wall, duration_s=max(now - interval.started, 0.0),
                          frequency_hz=self._frequency_hz, event="cpu-clock")
        resources = Resources(self._resources_host, interval.processes, self.options.service_name)
        events = {"cpu": cpu, "off-cpu": off_cpu} if off_cpu else {"cpu": cpu}
        body = encode(Record(meta, interval.table.frames), resources, events).SerializeToString()
        request = QueuedRequest(body, sum(s.count for s in cpu), now)
        with self.stats.lock:
            self.stats.encode_seconds += time.perf_counter() - started
        if request.size > MAX_REQUEST_BYTES:
            self.stats.done(request, "dropped_too_large")
            return
        for dropped in self.queue.put(request):
            with self.stats.lock:
                in_flight = dropped is self._sending
            if not in_flight:  # else the sender counts it when its try ends
                self.stats.done(dropped, "dropped_queue_full")

    def take_warnings(self) -> list[str]:
        with self._warnings_lock:
            taken, self._warnings = self._warnings, []
        return taken

    def close(self) -> None:
        """Queue what the interval holds, give the sender FLUSH_S to send it (unless the backend is failing),
        then stop."""
        if self._thread is None:
            return
        self._finish(self._clock())
        if not self._failing:
            self.queue.wait_empty(FLUSH_S)
        self._stop.set()
        self.queue.close()
        if self._transport is not None:
            self._transport.close()
        self._thread.join(1.0)

    # -- the sender's side ---------------------------------------------------------------------------------
    def _send_loop(self) -> None:
        while not self._stop.is_set():
            request = self.queue.head(timeout=0.5)
            if request is None:
                continue
            with self.stats.lock:
                self._sending = request  # dropped from the queue meanwhile, it is counted by _outcome
            delay = self._outcome(request, self._transport.send(request.body, self.options.timeout_s))
            with self.stats.lock:
                self._sending = None
            if delay:
                self._stop.wait(delay)

    def _outcome(self, request: QueuedRequest, result: SendResult) -> float:
        """Count what the try gave; the time to wait before the next try of the same request (0: none)."""
        if result.ok:
            self._failing = self._warned_failing = False
            self._sent_at = self._clock()
            self._done(request, "sent")
            with self.stats.lock:
                self.stats.rejected_profiles += result.rejected
            if result.rejected or result.message:
                self._warn(f"OTLP export to {self.options.endpoint}: the backend kept all but {result.rejected} "
                           f"profiles: {result.message or '(no reason given)'}")
            return 0.0
        self._last_failure = f"{result.reason}{': ' + result.message if result.message else ''}"
        if result.retryable and not request.dropped:
            self._failing = True
            request.attempts += 1
            delay = result.delay_s if result.delay_s is not None else backoff(request.attempts)
            if self._clock() + delay - request.created <= MAX_RETRY_ELAPSED_S:
                with self.stats.lock:
                    self.stats.retries[result.reason] += 1
                self._warn(f"OTLP export to {self.options.endpoint} failed ({result.reason}"
                           f"{': ' + result.message if result.message else ''}): retrying with backoff")
                return delay
            self._done(request, "dropped_retries")
            return 0.0
        if not result.retryable:
            self._warn(f"OTLP export to {self.options.endpoint} refused ({result.reason}"
                       f"{': ' + result.message if result.message else ''}): the profile was dropped")
        self._done(request, "rejected" if not result.retryable else "dropped_queue_full")
        return 0.0

    def _done(self, request: QueuedRequest, outcome: str) -> None:
        if not self.queue.done(request) and outcome != "sent":
            outcome = "dropped_queue_full"  # dropped from the queue while being tried
        self.stats.done(request, outcome)

    def _warn(self, message: str) -> None:
        with self._warnings_lock:
            self._warnings.append(message)

    # -- /metrics ------------------------------------------------------------------------------------------
    def collector(self) -> Collector:
        return _OtlpCollector(self)


class _OtlpCollector(Collector):
    def __init__(self, exporter: OtlpExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        exporter, stats = self._exporter, self._exporter.stats
        with stats.lock:
            requests = {outcome: stats.requests[outcome] for outcome in OUTCOMES}
            samples = {outcome: stats.samples[outcome] for outcome in OUTCOMES}
            retries, sent_bytes = dict(stats.retries), stats.sent_bytes
            rejected, encode_seconds = stats.rejected_profiles, stats.encode_seconds
        yield counted_by("optrace_otlp_requests", "OTLP profiles requests (one per interval) by outcome: sent, "
                         "rejected by the backend, or dropped (queue full, retries given up, too large).",
                         "outcome", requests)
        yield counted_by("optrace_otlp_samples", "CPU samples in those requests, by the same outcomes.", "outcome",
                         samples)
        yield counted_by("optrace_otlp_retries", "Tries of a request that failed and were retried, by reason (gRPC "
                         "code, HTTP status, connection).", "reason", retries)
        yield CounterMetricFamily("optrace_otlp_sent_bytes", "Bytes of the requests sent (protobuf, before "
                                  "compression).", value=sent_bytes)
        yield CounterMetricFamily("optrace_otlp_rejected_profiles", "Profiles a backend said it did not keep "
                                  "(partial success).", value=rejected)
        yield CounterMetricFamily("optrace_otlp_encode_seconds",
                                  "Time the drain loop spent encoding the requests (elapsed, not CPU time).",
                                  value=encode_seconds)
        for name, help_text, value in (
                ("optrace_otlp_queue_bytes", "Bytes of requests waiting to be sent (the one being sent included).",
                 exporter.queue.bytes),
                ("optrace_otlp_queue_requests", "Requests waiting to be sent.", len(exporter.queue)),
                ("optrace_otlp_queue_max_bytes", "The queue's bound (--otlp-queue-bytes).", exporter.queue.max_bytes)):
            yield GaugeMetricFamily(name, help_text, value=value)
