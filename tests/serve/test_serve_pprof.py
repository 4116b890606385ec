"""`GET /debug/pprof/profile?seconds=N` of serve, with a fake profile source of known shares (no BPF), read
by `go tool pprof` from the URL; bad N, one collection per client, auth, stop; the window's bounds."""
from __future__ import annotations

import base64
import gzip
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import bcrypt
import pytest

from optrace.frontend.serve import profilewindows
from optrace.frontend.serve.daemon import ServeDaemon
from optrace.frontend.serve.options import ServeOptions
from optrace.frontend.serve.httpserver import ListenAddress
from optrace.exporters.pprofproto import profile_pb2
from optrace.frontend.serve.profilewindows import _Window
from optrace.frontend.serve.stacktable import OVER_LIMIT
from optrace.frontend.serve.totals import Delta
from optrace.frontend.serve.webconfig import WebConfig
from optrace.model import Frame, Sample
from pprofclient import top

OPTRACE = Path(sys.executable).parent / "optrace"
CPU = "optrace_cpu_seconds_total"
FRAMES = [Frame("main", "/w/app"), Frame("hot_a", "/w/app"), Frame("hot_b", "/w/app"), Frame("evil\x1b[2J\udc80", "/w/app")]


class StackSource:
    """Each drain: 3 samples in main->hot_a, 1 in main->hot_b, 1 in a hostile name (stacks only when the
    daemon asks)."""

    event = "cpu-clock"

    def __init__(self) -> None:
        self.asked = 0

    def start(self) -> None:
        pass

    def collect(self, delta: Delta) -> None:
        samples = [Sample(7, "app", (1, 0), 3), Sample(7, "app", (2, 0), 1)]
        delta.cpu_samples[("app", "/w/app", "hot_a")] += 3
        if delta.want_stacks:
            self.asked += 1
            delta.stacks = (list(FRAMES), samples + [Sample(8, "evil\x07", (3,), 1)])

    def close(self) -> None:
        pass


@pytest.fixture
def daemon(request):
    web = getattr(request, "param", WebConfig())
    options = ServeOptions(listen=ListenAddress("127.0.0.1", 0), drain_interval_s=0.05, web=web)
    source = StackSource()
    daemon = ServeDaemon(options, [source])
    stop = threading.Event()
    urls: list[str] = []
    ready = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), kwargs={"on_ready": lambda u: (urls.append(u), ready.set())})
    thread.start()
    assert ready.wait(10)
    daemon.base = urls[0].removesuffix("/metrics")
    daemon.source = source
    daemon.stop_event = stop
    yield daemon
    stop.set()
    thread.join(10)


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_go_pprof_reads_the_url_with_the_shares(daemon, tmp_path) -> None:
    rows = top(f"{daemon.base}/debug/pprof/profile?seconds=2", tmp_path)
    assert rows["hot_a"].flat_percent == 60.0 and rows["hot_b"].flat_percent == 20.0
    assert rows[r"evil\x1b[2J\udc80"].flat_percent == 20.0 and rows["main"].cum_percent == 80.0
    assert not daemon.windows.active() and daemon.source.asked >= 5  # stacks only while the window was open


def test_the_profile_covers_the_window(daemon) -> None:
    started = time.monotonic()
    status, body = get(f"{daemon.base}/debug/pprof/profile?seconds=1")
    took = time.monotonic() - started
    assert status == 200 and 1.0 <= took < 20  # the machine may be loaded
    profile = profile_pb2.Profile.FromString(gzip.decompress(body))
    strings = profile.string_table
    assert [strings[t.type] for t in profile.sample_type] == ["samples", "cpu"]
    drains = sum(s.value[0] for s in profile.sample) / 5  # 5 samples a drain
    assert 3 <= drains <= took / 0.05 + 2
    assert 0.9e9 <= profile.duration_nanos <= took * 1e9 + 1e8
    labels = {strings[label.str] for sample in profile.sample for label in sample.label if label.str}
    assert labels == {"app", r"evil\x07"}  # escaped: nothing raw reaches a terminal


@pytest.mark.parametrize("query", ["seconds=0", "seconds=-1", "seconds=abc", "seconds=100000", "seconds=",
                                   "seconds=1.5", "seconds=%E2%91%A0"])
def test_bad_seconds_are_400_in_one_line(daemon, query: str) -> None:
    status, body = get(f"{daemon.base}/debug/pprof/profile?{query}", timeout=5)
    assert status == 400
    assert body.count(b"\n") == 1 and body.startswith(b"bad seconds=") and b"1 to 300" in body
    assert not daemon.windows.active()


def test_one_collection_per_client(daemon) -> None:
    results: list[int] = []
    first = threading.Thread(target=lambda: results.append(get(f"{daemon.base}/debug/pprof/profile?seconds=2")[0]))
    first.start()
    deadline = time.monotonic() + 5
    while not daemon.windows.active() and time.monotonic() < deadline:
        time.sleep(0.01)
    status, body = get(f"{daemon.base}/debug/pprof/profile?seconds=1", timeout=5)
    assert status == 429 and b"already being collected" in body
    first.join(10)
    assert results == [200]
    assert get(f"{daemon.base}/debug/pprof/profile?seconds=1")[0] == 200  # free again


@pytest.mark.parametrize("daemon", [WebConfig(users={"prom": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))})], indirect=True)
def test_behind_basic_auth(daemon) -> None:
    assert get(f"{daemon.base}/debug/pprof/profile?seconds=1", timeout=5)[0] == 401
    assert not daemon.windows.active()
    good = {"Authorization": "Basic " + base64.b64encode(b"prom:pw").decode()}
    assert get(f"{daemon.base}/debug/pprof/profile?seconds=1", good)[0] == 200


def test_stopping_answers_waiting_requests(daemon) -> None:
    results: list[tuple[int, bytes]] = []
    waiting = threading.Thread(target=lambda: results.append(get(f"{daemon.base}/debug/pprof/profile?seconds=60")))
    waiting.start()
    time.sleep(0.5)
    daemon.stop_event.set()
    waiting.join(10)
    assert results and results[0][0] == 503, results


def test_a_window_keeps_bounded_stacks(monkeypatch) -> None:
    monkeypatch.setattr(profilewindows, "MAX_WINDOW_STACKS", 10)
    window = _Window("c", 0.0, 0.0, 1.0)
    frames = [Frame(f"f{i}", "/w/x") for i in range(50)]
    window.add(frames, [Sample(1, "x", (i,), 2) for i in range(50)])
    window.add(frames, [Sample(1, "x", (i,), 1) for i in range(5)])  # known stacks still count
    assert len(window.stacks) == 11 and sum(window.stacks.values()) == 105
    over = Counter({window.frames[key[2][0]]: n for key, n in window.stacks.items()})
    assert over[OVER_LIMIT] == 80 and over[frames[0]] == 3


def start_serve(args: list[str], tmp: Path) -> tuple[subprocess.Popen, str]:
    """`optrace serve` on a free port; (process, base URL) once it says it serves."""
    err = tmp / "serve.err"
    with open(err, "w") as sink:
        process = subprocess.Popen([str(OPTRACE), "serve", "--listen", "127.0.0.1:0", *args],
                                   stdout=subprocess.DEVNULL, stderr=sink)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = re.search(r"serving (\S+)/metrics", err.read_text())
        if found:
            return process, found.group(1)
        assert process.poll() is None, err.read_text()
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"serve did not start: {err.read_text()}")


@pytest.mark.slow
@pytest.mark.usefixtures("bpf_ready")
def test_ground_truth_from_the_url(workloads: Path, tmp_path: Path, expo) -> None:
    """demo (40% hot_a) runs inside a 30 s window that `go tool pprof` collects from the URL: the share it
    shows is the one serve's own counters show for the same samples (±1 point), and the ground truth's."""
    folder = tmp_path / "w"
    folder.mkdir()
    for name, copy in (("demo", "ppdemo"), ("libburn.so", "libburn.so")):
        shutil.copy2(workloads / name, folder / copy)
    process, base = start_serve(["-F", "499", "--comm", "ppdemo"], tmp_path)
    try:
        before = expo.scrape(base + "/metrics")
        rows: list[dict] = []
        fetch = threading.Thread(target=lambda: rows.append(top(f"{base}/debug/pprof/profile?seconds=30", tmp_path)))
        fetch.start()
        time.sleep(2.5)  # the window is open (go tool pprof starts in well under this)
        started = time.monotonic()
        subprocess.run([str(folder / "ppdemo"), "1"], check=True)
        ran = time.monotonic() - started
        fetch.join(60)
        after = expo.scrape(base + "/metrics")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert ran < 25, f"ppdemo took {ran:.1f} s of wall time: the machine is too loaded for the 30 s window"
    total = expo.value(after, CPU, comm="ppdemo") - expo.value(before, CPU, comm="ppdemo")
    hot_a = expo.value(after, CPU, comm="ppdemo", symbol="hot_a") - expo.value(before, CPU, comm="ppdemo", symbol="hot_a")
    assert total > 0.8  # seconds: ppdemo ran 1 s of CPU
    assert abs(rows[0]["hot_a"].flat_percent - 100 * hot_a / total) <= 1, (rows[0]["hot_a"], hot_a, total)
    assert abs(rows[0]["hot_a"].flat_percent - 40) <= 5
    assert rows[0]["main"].cum_percent >= 90
