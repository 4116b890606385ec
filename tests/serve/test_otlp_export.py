"""serve's OTLP push without BPF: a daemon draining a source of known stacks pushes to the receivers of
tests/otlpreceiver.py (the generated gRPC servicer, a small HTTP server); the answers the OTLP spec calls
retryable are retried with their delays, the others dropped; a backend down or stuck costs the oldest
profiles, never a drain and never memory past the queue's bound; the self-metrics say what happened."""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from optrace.frontend.serve.config import build_options
from optrace.frontend.serve.daemon import ServeDaemon
from optrace.frontend.serve.httpserver import ListenAddress
from optrace.frontend.serve.otlpconfig import OtlpOptions
from optrace.frontend.serve.otlpexport import MAX_RETRY_ELAPSED_S, OtlpExporter, backoff
from optrace.frontend.serve.otlpqueue import QueuedRequest, RequestQueue
from optrace.frontend.serve.otlptransport import GrpcTransport, HttpTransport, SendResult, retry_after_seconds
from optrace.frontend.serve.totals import Delta
from optrace.model import Frame, Sample
from otlpreceiver import Failure, GrpcReceiver, grpc_receiver, http_receiver  # noqa: F401  (fixtures)

ME = os.getpid()  # a real process: its resource attributes come from /proc
FRAMES = [Frame("main", "/w/app", address=0x100, build_id="ab" * 20), Frame("hot_a", "/w/app", address=0x200),
          Frame("hot_b", "/w/app", address=0x300), Frame("schedule", "[kernel.kallsyms]", kind="kernel", address=1 << 63)]


class StackSource:
    """Each drain: main->hot_a 3, main->hot_b 1 (pid ME), and off-CPU time in schedule() when asked; with
    ``distinct``, that many more stacks that are new every drain (big requests)."""

    event = "cpu-clock"

    def __init__(self, distinct: int = 0) -> None:
        self.distinct = distinct
        self.drains = 0
        self.samples = 0
        self.lock = threading.Lock()

    def start(self) -> None:
        pass

    def collect(self, delta: Delta) -> None:
        frames = list(FRAMES)
        samples = [Sample(ME, "app", (1, 0), 3), Sample(ME, "app", (2, 0), 1)]
        for i in range(self.distinct):
            frames.append(Frame(f"f{self.drains}_{i}", "/w/app"))
            samples.append(Sample(ME, "app", (len(frames) - 1, 0), 1))
        with self.lock:
            self.drains += 1
            self.samples += sum(s.count for s in samples)
        delta.cpu_samples[("app", "/w/app", "hot_a")] += sum(s.count for s in samples)
        if delta.want_stacks:
            delta.stacks = (frames, samples)
        if delta.want_off_cpu_stacks:
            delta.off_cpu_stacks = (frames, [Sample(ME, "app", (3, 0), 5_000_000)])

    def close(self) -> None:
        pass


def options(endpoint: str, protocol: str = "grpc", **settings) -> OtlpOptions:
    key = "otlp_endpoint"
    return build_options({key: endpoint, "otlp_protocol": protocol, "otlp_interval": 1, **settings}, environ={}).otlp


class Running:
    """A daemon on a thread (drains every 50 ms), its source, its /metrics page."""

    def __init__(self, otlp: OtlpOptions, source: StackSource | None = None) -> None:
        self.source = source or StackSource()
        serve = build_options({"listen": "127.0.0.1:0"}, environ={})
        serve.drain_interval_s, serve.otlp = 0.05, otlp
        self.daemon = ServeDaemon(serve, [self.source])
        self.stop_event = threading.Event()
        ready = threading.Event()
        self.thread = threading.Thread(target=self.daemon.run, args=(self.stop_event,), kwargs={"on_ready": lambda u: ready.set()})
        self.thread.start()
        assert ready.wait(10)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def page_of(running: Running, expo) -> str:
    return expo.scrape(running.daemon._server.url)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_each_interval_reaches_the_generated_servicer(grpc_receiver) -> None:  # noqa: F811
    running = Running(options(grpc_receiver.endpoint, otlp_headers="authorization=Bearer%20t0k", service_name="web",
                              resource_attributes="deployment.environment.name=test"))
    wait_until(lambda: grpc_receiver.inbox.count() >= 2, 30, "two intervals")
    running.stop()  # the last interval is sent at exit
    page = page_of_stopped(running)
    profiles = grpc_receiver.inbox.profiles()
    cpu = [p for p in profiles if p.sample_type == ("samples", "count")]
    off_cpu = [p for p in profiles if p.sample_type == ("off_cpu", "nanoseconds")]
    assert sum(p.total for p in cpu) == running.source.samples  # every sample of every drain, once
    assert sum(p.total for p in off_cpu) == 5_000_000 * running.source.drains
    leaves = sum((p.leaves() for p in cpu), Counter())
    assert leaves == Counter({"hot_a": 3 * running.source.drains, "hot_b": running.source.drains})
    assert all(p.inclusive()["main"] == p.total for p in cpu)
    assert off_cpu[0].samples[0].stack[0].frame_type == "kernel" and off_cpu[0].period == 0
    resource = cpu[0].resource
    assert resource["process.pid"] == ME and resource["process.executable.path"] == os.path.realpath(sys.executable)
    assert resource["service.name"] == "web" and resource["deployment.environment.name"] == "test"
    assert resource["host.name"] == os.uname().nodename and resource["host.arch"] == "amd64"
    assert resource["process.command_line"] == " ".join(sys.orig_argv)
    assert {received.headers["authorization"] for received in grpc_receiver.inbox.received} == {"Bearer t0k"}
    assert 0.9e9 <= cpu[1].duration_nano <= 3e9 and cpu[1].time_unix_nano > cpu[0].time_unix_nano
    assert cpu[0].period == 10**9 // running.daemon.options.frequency_hz and cpu[0].scope[0] == "optrace"
    assert page["sent"] == grpc_receiver.inbox.count() and page["samples_sent"] == running.source.samples


def page_of_stopped(running: Running) -> dict[str, float]:
    """The exporter's counters once stopped (the page is no longer served)."""
    stats = running.daemon.otlp.stats
    return {"sent": stats.requests["sent"], "samples_sent": stats.samples["sent"], **{
        f"dropped:{k}": v for k, v in stats.requests.items() if k != "sent"}}


def test_http_protobuf_to_its_path(http_receiver) -> None:  # noqa: F811
    running = Running(options(http_receiver.endpoint, "http/protobuf", otlp_headers="x-scope-orgid=tenant1"))
    wait_until(lambda: http_receiver.inbox.count() >= 2, 30, "two intervals")
    running.stop()
    cpu = http_receiver.inbox.profiles()
    assert sum(p.total for p in cpu if p.sample_type[0] == "samples") == running.source.samples
    headers = http_receiver.inbox.received[0].headers
    assert headers["content-type"] == "application/x-protobuf" and headers["content-encoding"] == "gzip"
    assert headers["x-scope-orgid"] == "tenant1" and headers["user-agent"].startswith("optrace/")


def test_retryable_answers_are_tried_again_after_the_delay_asked(grpc_receiver, expo) -> None:  # noqa: F811
    """UNAVAILABLE with a RetryInfo of 1.5 s: each try comes that long after the last (not the backoff's
    0.5-1.5 s); once the backend takes them, everything queued meanwhile arrives."""
    grpc_receiver.inbox.failure = Failure("UNAVAILABLE", delay_s=1.5)
    running = Running(options(grpc_receiver.endpoint))
    wait_until(lambda: grpc_receiver.inbox.refused >= 3, 30, "three refusals")
    retries = expo.value(page_of(running, expo), "optrace_otlp_retries_total", reason="UNAVAILABLE")
    grpc_receiver.inbox.failure = None
    wait_until(lambda: grpc_receiver.inbox.count() >= 3, 30, "the queue sent")
    running.stop()
    refused = grpc_receiver.inbox.refused_at
    assert all(later - earlier >= 1.45 for earlier, later in zip(refused, refused[1:])), refused
    assert retries >= 2
    assert sum(p.total for p in grpc_receiver.inbox.profiles() if p.sample_type[0] == "samples") == running.source.samples


@pytest.mark.parametrize("failure,retryable,delay", [
    (Failure("UNAVAILABLE"), True, None), (Failure("RESOURCE_EXHAUSTED"), False, None),
    (Failure("RESOURCE_EXHAUSTED", 2.5), True, 2.5), (Failure("INVALID_ARGUMENT"), False, None),
    (Failure("DEADLINE_EXCEEDED"), True, None), (Failure("UNAUTHENTICATED"), False, None),
])
def test_grpc_codes_as_the_spec_reads_them(grpc_receiver, failure: Failure, retryable: bool, delay) -> None:  # noqa: F811
    grpc_receiver.inbox.failure = failure
    transport = GrpcTransport(options(grpc_receiver.endpoint))
    try:
        result = transport.send(b"", 5)
    finally:
        transport.close()
    assert (result.ok, result.retryable, result.delay_s, result.reason) == (False, retryable, delay, failure.status)
    assert result.message == "test receiver says no"


@pytest.mark.parametrize("failure,retryable,delay", [
    (Failure(503, 3), True, 3.0), (Failure(429), True, None), (Failure(502), True, None), (Failure(504), True, None),
    (Failure(400), False, None), (Failure(500), False, None), (Failure(401), False, None),
])
def test_http_statuses_as_the_spec_reads_them(http_receiver, failure: Failure, retryable: bool, delay) -> None:  # noqa: F811
    http_receiver.inbox.failure = failure
    transport = HttpTransport(options(http_receiver.endpoint, "http/protobuf"))
    try:
        result = transport.send(b"", 5)
    finally:
        transport.close()
    assert (result.ok, result.retryable, result.delay_s, result.reason) == (False, retryable, delay, f"http {failure.status}")
    assert result.message == "test receiver says no"


def test_no_server_is_a_retryable_connection_failure() -> None:
    transport = HttpTransport(options("http://127.0.0.1:9", "http/protobuf"))
    assert transport.send(b"", 5) == SendResult(False, True, None, "connection", transport.send(b"", 5).message)
    grpc = GrpcTransport(options("http://127.0.0.1:9"))
    try:
        assert grpc.send(b"", 5).reason == "UNAVAILABLE" and grpc.send(b"", 5).retryable
    finally:
        grpc.close()


def test_retry_after_as_a_date() -> None:
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("120") == 120.0 and retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    assert [backoff(n, lambda low, high: 1.0) for n in (1, 2, 3, 4, 5, 6, 7, 20)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff(1, lambda low, high: low) == 0.5 and backoff(6, lambda low, high: high) == 45.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_request_is_dropped_once_retrying_it_would_pass_the_limit() -> None:
    clock = FakeClock()
    exporter = OtlpExporter(options("http://127.0.0.1:9"), 99, clock=clock)
    request = QueuedRequest(b"x" * 10, samples=7, created=clock.now)
    exporter.queue.put(request)
    unavailable = SendResult(False, True, None, "UNAVAILABLE")
    waited = 0.0
    while exporter.queue.bytes:
        delay = exporter._outcome(request, unavailable)
        waited, clock.now = waited + delay, clock.now + delay
        assert waited <= MAX_RETRY_ELAPSED_S
    assert exporter.stats.requests == Counter({"dropped_retries": 1}) and exporter.stats.samples["dropped_retries"] == 7
    assert sum(exporter.stats.retries.values()) >= 8 and waited >= MAX_RETRY_ELAPSED_S - 45
    throttled = QueuedRequest(b"y", samples=1, created=clock.now)
    exporter.queue.put(throttled)
    assert exporter._outcome(throttled, SendResult(False, True, MAX_RETRY_ELAPSED_S + 1, "UNAVAILABLE")) == 0.0
    assert exporter.stats.requests["dropped_retries"] == 2  # a server delay past the limit: dropped at once
    refused = QueuedRequest(b"z", samples=2, created=clock.now)
    exporter.queue.put(refused)
    assert exporter._outcome(refused, SendResult(False, False, None, "INVALID_ARGUMENT", "bad data")) == 0.0
    assert exporter.stats.requests["rejected"] == 1 and "INVALID_ARGUMENT: bad data" in exporter.take_warnings()[-1]


def test_the_queue_keeps_its_bound_dropping_the_oldest() -> None:
    queue = RequestQueue(100)
    first, second, third = (QueuedRequest(bytes(40), i, 0.0) for i in range(3))
    assert queue.put(first) == [] and queue.put(second) == []
    assert queue.head() is first  # being sent: still counted
    assert queue.put(third) == [first] and queue.bytes == 80 and first.dropped
    assert not queue.done(first) and queue.head() is second
    huge = QueuedRequest(bytes(101), 9, 0.0)
    assert queue.put(huge) == [huge] and queue.bytes == 80
    assert queue.done(second) and queue.done(third) and queue.bytes == 0 and queue.head(timeout=0.01) is None


@pytest.mark.parametrize("backend", ["down", "stuck"])
def test_a_backend_down_or_stuck_costs_old_profiles_not_drains_or_memory(backend: str, expo) -> None:
    """200 new stacks a drain make each 1 s interval's request ~0.2 MB, against a 256 KiB queue: with
    nothing listening, or a backend that never answers, the queue stays within its bound by dropping the
    oldest requests, and the drain loop keeps its pace."""
    release = threading.Event()
    hanging = _HangingReceiver(release) if backend == "stuck" else None
    endpoint = hanging.endpoint if hanging else "http://127.0.0.1:9"
    running = Running(options(endpoint, otlp_queue_bytes=256 << 10, otlp_timeout=30), StackSource(distinct=200))
    try:
        started = time.monotonic()
        highest = 0.0
        while time.monotonic() - started < 6:
            highest = max(highest, expo.value(page_of(running, expo), "optrace_otlp_queue_bytes"))
            time.sleep(0.2)
        page = page_of(running, expo)
    finally:
        release.set()
        running.stop()
        if hanging:
            hanging.stop()
    assert expo.value(page, "optrace_drains_total") >= 6 / 0.05 * 0.5  # the pace of 0.05 s (half, under load)
    assert 0 < highest <= 256 << 10
    assert expo.value(page, "optrace_otlp_requests_total", outcome="dropped_queue_full") >= 1
    assert expo.value(page, "optrace_otlp_samples_total", outcome="dropped_queue_full") > 0


class _HangingReceiver:
    """A ProfilesService whose Export waits until released (a backend that is stuck)."""

    def __init__(self, release: threading.Event) -> None:
        import grpc
        from concurrent.futures import ThreadPoolExecutor
        from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc

        class Hang(profiles_service_pb2_grpc.ProfilesServiceServicer):
            def Export(self, request, context):  # noqa: N802
                release.wait(60)
                context.abort(grpc.StatusCode.UNAVAILABLE, "was stuck")

        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(Hang(), self._server)
        self.endpoint = f"http://127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def stop(self) -> None:
        self._server.stop(None).wait(10)
