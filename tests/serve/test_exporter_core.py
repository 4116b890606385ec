"""The exporter core without BPF: guard, totals, page, HTTP(S) server, daemon loop, with fake sources."""
from __future__ import annotations

import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optrace.frontend.serve.cardinality import OTHER, SeriesGuard
from optrace.frontend.serve.daemon import ServeDaemon
from optrace.frontend.serve.options import ServeOptions
from optrace.frontend.serve.httpserver import ListenAddress, TlsFiles, WebConfig
from optrace.frontend.serve.metricspage import ExporterInfo, MetricsPage
from optrace.frontend.serve.totals import add_leaf_rows, leaf_labels
from optrace.frontend.serve.sources import CallSource
from optrace.frontend.serve.totals import Delta, ExporterTotals, guard_for
from optrace.errors import OptraceError
from optrace.model import CallCount, Frame, Sample

CPU = "optrace_cpu_seconds_total"
LABEL_SETS = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["/x", "/y"]), st.text(min_size=1, max_size=3))


@settings(max_examples=200, deadline=None)
@given(max_series=st.integers(3, 30), stream=st.lists(st.tuples(LABEL_SETS, st.integers(1, 5)), max_size=300))
def test_guard_caps_series_keeps_every_sample_and_never_moves_a_series(max_series, stream):
    totals = ExporterTotals(max_series)
    before: dict = {}
    for labels, amount in stream:
        totals.apply(Delta(cpu_samples=Counter({labels: amount})), drain_seconds=0)
        values = totals.cpu_samples.values()
        assert len(values) <= max_series
        assert all(values[k] >= v for k, v in before.items())  # monotonic, no series removed
        before = values
    assert sum(before.values()) == sum(a for _, a in stream)
    regular = sum(v for k, v in before.items() if OTHER not in k)
    assert totals.cpu_samples.overflow == sum(before.values()) - regular


def test_guard_degrades_symbol_first_then_everything():
    guard = guard_for(("comm", "dso", "symbol"), "symbol", max_series=4)  # 2 regular, 1 coarse, 1 catch-all
    existing: dict = {}
    for labels in [("a", "/x", "f"), ("a", "/x", "g"), ("a", "/x", "h"), ("b", "/y", "k"), ("a", "/x", "i")]:
        existing.setdefault(guard.admit(labels, existing).labels, 0)
    assert list(existing) == [("a", "/x", "f"), ("a", "/x", "g"), ("a", "/x", OTHER), (OTHER, OTHER, OTHER)]
    assert guard.admit(("a", "/x", "f"), existing).overflow is False
    with pytest.raises(ValueError):
        SeriesGuard(2, coarse_index=2, label_count=3)


def test_uprobe_metric_degrades_comm_not_symbol():
    totals = ExporterTotals(3)
    for comm in ("p1", "p2", "p3", "p4"):
        totals.apply(Delta(uprobe_calls=Counter({("/bin/x", "f", comm): 1})), drain_seconds=0)
    assert totals.uprobe_calls.values() == {("/bin/x", "f", "p1"): 1, ("/bin/x", "f", OTHER): 3}


def test_leaf_labels_fold_jit_files_and_unresolved_addresses():
    frames = [
        Frame("hot_a", "/w/demo"),
        Frame("demo+0x1234", "/w/demo", resolved=False),
        Frame("Hot.f(long)", "[jit] /tmp/perf-4242.map"),
    ]
    delta = Delta()
    add_leaf_rows(delta, frames, [Sample(1, "demo", (0,), 3), Sample(1, "demo", (1, 0), 2),
                                  Sample(7, "java", (2,), 5), Sample(8, "kworker", (), 1)])
    assert delta.cpu_samples == Counter({("demo", "/w/demo", "hot_a"): 3, ("demo", "/w/demo", "[unknown]"): 2,
                                         ("java", "[jit]", "Hot.f(long)"): 5, ("kworker", "[unknown]", "[unknown]"): 1})
    assert delta.unresolved_frames == 3
    assert leaf_labels("x", None) == ("x", "[unknown]", "[unknown]")


class FakeCounter:
    def __init__(self) -> None:
        self.per_pid: dict[int, int] = {}
        self.unattributed = 0  # calls the kernel's per-pid map had no room for
        self.retired = 0  # calls of exited pids no longer listed (CallCounter's contract)

    def calls(self) -> list[CallCount]:
        total = sum(self.per_pid.values()) + self.unattributed + self.retired
        return [CallCount("c:getpid", "/lib/libc.so.6", "getpid", 0, total, dict(self.per_pid),
                          comms={pid: f"p{pid}" for pid in self.per_pid if pid != 12},
                          unattributed=self.unattributed)]


def test_call_source_turns_cumulative_counts_into_increments():
    source = CallSource(["c:getpid"], comms=[], targets=None)
    source.counter = FakeCounter()
    source.counter.per_pid = {10: 5, 11: 2, 12: 1}
    first = Delta()
    source.collect(first)
    source.counter.per_pid = {10: 9, 12: 1}  # 11 exited: no longer listed, its calls stay in the total
    source.counter.retired = 2
    source.counter.unattributed = 3
    second = Delta()
    source.collect(second)
    libc = ("/lib/libc.so.6", "getpid")
    assert first.uprobe_calls == Counter({(*libc, "p10"): 5, (*libc, "p11"): 2, (*libc, "[unknown]"): 1})
    assert second.uprobe_calls == Counter({(*libc, "p10"): 4, (*libc, "[unknown]"): 3})
    assert set(source._seen) == {("/lib/libc.so.6", 0, 10), ("/lib/libc.so.6", 0, 12), ("/lib/libc.so.6", 0, None)}


class GlobCounter:
    """One glob SPEC resolved to two functions: two rows with the same `probe`."""

    def __init__(self, calls: int) -> None:
        self.n = calls

    def calls(self) -> list[CallCount]:
        return [CallCount("c:get*", "/lib/libc.so.6", name, offset, self.n, {10: self.n}, comms={10: "p"})
                for name, offset in (("getpid", 0x100), ("getppid", 0x200))]


def test_call_source_keeps_glob_rows_apart():
    source = CallSource(["c:get*"], comms=[], targets=None)
    source.counter = GlobCounter(4)
    first = Delta()
    source.collect(first)
    source.counter.n = 6
    second = Delta()
    source.collect(second)
    assert first.uprobe_calls == Counter({("/lib/libc.so.6", "getpid", "p"): 4, ("/lib/libc.so.6", "getppid", "p"): 4})
    assert second.uprobe_calls == Counter({("/lib/libc.so.6", "getpid", "p"): 2, ("/lib/libc.so.6", "getppid", "p"): 2})


def test_cpu_time_is_in_seconds_and_counts_are_whole_numbers(expo):
    """Prometheus' conventions: CPU in seconds (samples / -F: rate() reads as CPUs), counts printed as the
    integers they are (prometheus-client's generate_latest printed every value as a float: 4.0)."""
    totals = ExporterTotals(100)
    totals.apply(Delta(cpu_samples=Counter({("demo", "/w/demo", "hot_a"): 81, ("demo", "/w/demo", "hot_b"): 198}),
                       lost=Counter({"counts_map_full": 2}), idle_samples=5, execs=3), 0.25)
    text = MetricsPage(totals, ExporterInfo(99, "cpu-clock")).render().decode()
    assert expo.value(text, CPU, symbol="hot_a") == pytest.approx(81 / 99)
    assert f'{CPU}{{comm="demo",dso="/w/demo",symbol="hot_b"}} 2.0\n' in text  # seconds: a float, even when whole
    assert "optrace_cpu_samples_total" not in text
    for line in ('optrace_lost_samples_total{reason="counts_map_full"} 2', "optrace_idle_samples_total 5",
                 'optrace_process_events_total{event="exec"} 3', "optrace_drains_total 1", "optrace_drain_seconds_total 0.25",
                 f'optrace_series{{metric="{CPU}"}} 2', 'optrace_sampling_frequency_hertz{event="cpu-clock"} 99'):
        assert f"\n{line}\n" in text, line
    assert re.search(r'\noptrace_build_info\{python="[^"]+",version="[^"]+"\} 1\n', text)


def test_page_parses_escapes_labels_and_has_no_created_series(expo):
    totals = ExporterTotals(100)
    weird = 'op"er\\ator\n<>' + "\udcff"  # an undecodable byte as os.fsdecode leaves it
    totals.apply(Delta(cpu_samples=Counter({("demo", "/w/demo", weird): 7}), lost=Counter({"counts_map_full": 2})), 0.5)
    text = MetricsPage(totals, ExporterInfo(99, "cpu-clock")).render().decode()
    assert expo.samples(text, CPU) == {(("comm", "demo"), ("dso", "/w/demo"), ("symbol", 'op"er\\ator?<>?')): 7 / 99}
    assert expo.value(text, "optrace_lost_samples_total", reason="counts_map_full") == 2
    assert expo.value(text, "optrace_drains_total") == 1
    assert expo.value(text, "optrace_drain_seconds_total") == 0.5
    assert expo.value(text, "optrace_sampling_frequency_hertz", event="cpu-clock") == 99
    assert expo.value(text, "optrace_build_info", version="0.1.0") == 1
    assert "_created" not in text


def test_page_is_rendered_once_per_drain():
    totals = ExporterTotals(100)
    page = MetricsPage(totals, ExporterInfo(99, "cpu-clock"))
    first = page.render()
    assert page.render() is first
    totals.apply(Delta(cpu_samples=Counter({("a", "b", "c"): 1})), 0)
    assert page.render() is not first


class TickSource:
    """A fake profile: each drain adds one sample to a fixed symbol and one to a new process name."""

    event = "cpu-clock"

    def __init__(self) -> None:
        self.drains = 0
        self.closed = False

    def start(self) -> None:
        pass

    def collect(self, delta: Delta) -> None:
        self.drains += 1
        delta.cpu_samples[("demo", "/w/demo", "hot_a")] += 10
        delta.cpu_samples[(f"short{self.drains}", "/w/shortlived", "short_burn")] += 1

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def served(request):
    """A daemon with a TickSource on a free loopback port, drained every 20 ms."""
    options = ServeOptions(listen=ListenAddress("127.0.0.1", 0), max_series=50, drain_interval_s=0.02,
                           **getattr(request, "param", {}))
    source = TickSource()
    daemon = ServeDaemon(options, [source])
    stop = threading.Event()
    ready = threading.Event()
    urls: list[str] = []
    thread = threading.Thread(target=daemon.run, args=(stop,),
                              kwargs={"on_ready": lambda url: (urls.append(url), ready.set())})
    thread.start()
    assert ready.wait(10)
    yield urls[0], source, daemon
    stop.set()
    thread.join(10)
    assert source.closed and not thread.is_alive()


def test_many_scrapers_see_monotonic_counters_and_capped_series(served, expo):
    url, _, daemon = served
    seen: list[list[float]] = [[] for _ in range(4)]

    def scraper(out: list[float]) -> None:
        for _ in range(25):
            text = expo.scrape(url, gzip_ok=len(out) % 2 == 0)
            out.append(expo.value(text, CPU, symbol="hot_a"))
            assert expo.value(text, "optrace_series", metric=CPU) <= 50

    threads = [threading.Thread(target=scraper, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for series in seen:
        assert series == sorted(series) and series[-1] > series[0]
    while expo.value(text := expo.scrape(url), "optrace_drains_total") < 60:
        time.sleep(0.05)
    assert len(expo.samples(text, CPU)) == 50
    assert expo.value(text, "optrace_cardinality_overflow_total", metric=CPU) > 0
    total = sum(expo.samples(text, CPU).values()) * expo.value(text, "optrace_sampling_frequency_hertz")
    drains = expo.value(text, "optrace_drains_total")
    assert round(total) == drains * 11  # every sample is somewhere: nothing lost to the guard


def test_index_page_404_and_405(served):
    url, _, _ = served
    base = url.removesuffix("/metrics")
    with urllib.request.urlopen(base + "/") as response:
        assert b'href="/metrics"' in response.read()
        assert response.headers["Content-Type"].startswith("text/html")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(base + "/nothing")
    assert err.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"))
    assert err.value.code == 405


def test_tls_serves_https_and_refuses_plain_http(self_signed, expo):
    import ssl

    options = ServeOptions(listen=ListenAddress("127.0.0.1", 0), web=WebConfig(self_signed), drain_interval_s=0.02)
    daemon = ServeDaemon(options, [TickSource()])
    stop = threading.Event()
    urls: list[str] = []
    thread = threading.Thread(target=daemon.run, args=(stop,), kwargs={"on_ready": urls.append})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not urls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert urls[0].startswith("https://127.0.0.1:")
        time.sleep(0.1)
        context = ssl.create_default_context(cafile=self_signed.cert)
        assert expo.value(expo.scrape(urls[0], context=context), CPU, symbol="hot_a") > 0
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            expo.scrape(urls[0], context=ssl.create_default_context())  # not trusted without the cert
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            expo.scrape(urls[0].replace("https://", "http://"), timeout=3)
    finally:
        stop.set()
        thread.join(10)


def test_busy_port_and_bad_tls_files_are_one_line_errors(served, tmp_path):
    url, _, daemon = served
    with pytest.raises(OptraceError, match="cannot listen on 127.0.0.1:.*choose another --listen"):
        ServeDaemon(ServeOptions(listen=daemon.address), [TickSource()]).run(threading.Event())
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(OptraceError, match="cannot use TLS certificate"):
        ServeDaemon(ServeOptions(listen=ListenAddress("127.0.0.1", 0), web=WebConfig(TlsFiles(str(junk), str(junk)))),
                    [TickSource()]).run(threading.Event())


def test_process_tracker_indexes_each_process_once_and_forgets_it():
    from optrace.frontend.session import ProcessTracker
    from optrace.model import RawSample, UserFrame

    tracker = ProcessTracker()
    tracker.exec(10, "/bin/a")
    tracker.exec(11, "/bin/never-sampled")
    first = [RawSample(10, "a", (UserFrame(b"x", 1),), (), 1), RawSample(12, "k", (), (0xffff,), 1)]
    assert tracker.sampled(first) == ({10: "/bin/a"}, {10})
    again = [RawSample(10, "a", (UserFrame(b"x", 2),), (), 1)]
    assert tracker.sampled(again) == ({}, set())  # nothing new: no second snapshot
    assert tracker.sampled([RawSample(10, "a", (UserFrame(b"y", 2),), (), 1)]) == ({}, {10})  # a new object
    assert tracker.pids() == {10, 11, 12}
    for pid in (10, 11, 12):
        tracker.forget(pid)
    assert tracker.pids() == set()


def test_the_daemon_gives_free_heap_back_every_trim_interval(monkeypatch):
    """The drain loop gives glibc's free heap back (malloc_trim) every TRIM_EVERY_S, whatever the HTTP side does:
    table and symbol loads free blocks in the middle of the heap (issue 40)."""
    from optrace.frontend.serve import daemon as daemon_module
    from serve.servekit import running_daemon

    trims = []
    monkeypatch.setattr(daemon_module, "TRIM_EVERY_S", 0.2)
    monkeypatch.setattr(daemon_module, "release_free_memory", lambda: trims.append(time.monotonic()) or True)
    with running_daemon(ServeOptions(listen=ListenAddress("127.0.0.1", 0), drain_interval_s=0.05)):
        time.sleep(1.5)
    assert 3 <= len(trims) <= 9, trims
