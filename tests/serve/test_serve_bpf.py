"""`optrace serve` for real: BPF attached, ground-truth workloads, a real Prometheus scraping it.

Workloads are copied under unique names, so other processes on the machine (the whole machine is
profiled) cannot add to the series these tests read: their comm and binary labels are ours alone.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from optrace.frontend.unwind.copies import PENDING_DRAINS

from prometheusserver import query, running_prometheus
from support import bpf_prog_ids, still_loaded

OPTRACE = Path(sys.executable).parent / "optrace"
CPU = "optrace_cpu_seconds_total"
CALLS = "optrace_uprobe_calls_total"
pytestmark = [pytest.mark.bpf, pytest.mark.slow]


@dataclass
class Served:
    process: subprocess.Popen
    url: str
    stderr_path: Path

    def stop(self, timeout: float = 20) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def launch_serve(args: list[str], tmp: Path, listen: str = "127.0.0.1:0", env: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> tuple[subprocess.Popen, Path]:
    """`optrace serve` started, its stderr going to a file of ``tmp``: (process, that file)."""
    err_path = tmp / f"serve-{time.monotonic_ns()}.err"
    with open(err_path, "w") as err:
        process = subprocess.Popen([str(OPTRACE), "serve", "--listen", listen, *args],
                                   stdout=subprocess.DEVNULL, stderr=err, env=env, preexec_fn=preexec_fn)
    return process, err_path


def await_serving(process: subprocess.Popen, err_path: Path, timeout: float = 60) -> Served:
    """Wait for a launched serve's "serving URL" line (the BPF compile takes a few s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"serving (\S+)", err_path.read_text())
        if found:
            return Served(process, found.group(1), err_path)
        if process.poll() is not None:
            raise AssertionError(f"optrace serve exited {process.returncode}: {err_path.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"optrace serve did not start: {err_path.read_text()}")


def start_serve(args: list[str], tmp: Path, timeout: float = 60) -> Served:
    """Start `optrace serve` on a free loopback port and wait until it serves."""
    return await_serving(*launch_serve(args, tmp), timeout)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_drains(url: str, expo, count: int = 2) -> None:
    """Until the exporter has drained `count` more times: what ran before is in its counters then."""
    drains = expo.value(expo.scrape(url), "optrace_drains_total")
    wait_for(lambda: expo.value(expo.scrape(url), "optrace_drains_total") >= drains + count, 30, "drains")


@pytest.fixture(scope="module")
def unique_workloads(workloads, tmp_path_factory) -> Path:
    """demo (with its libburn.so), calls and shortlived under names nobody else runs."""
    folder = tmp_path_factory.mktemp("serve-workloads")
    os.chmod(folder, 0o755)
    for name, copy in (("demo", "srvdemo"), ("calls", "srvcalls"), ("shortlived", "srvshort"),
                       ("jitcode", "srvjit"), ("libburn.so", "libburn.so")):
        shutil.copy2(workloads / name, folder / copy)
    return folder


@pytest.fixture(scope="module")
def served(bpf_ready, unique_workloads, tmp_path_factory):
    """One serve session for the module: whole machine at 499 Hz, counting srvcalls:target."""
    tmp = tmp_path_factory.mktemp("serve")
    serve = start_serve(["-F", "499", "--uprobe", f"{unique_workloads}/srvcalls:target"], tmp)
    prog_ids = wait_for(lambda: bpf_prog_ids(serve.process.pid), 10, "BPF programs in the serve process")
    yield serve
    if serve.process.poll() is None:  # the SIGTERM test normally stopped it already
        serve.stop()
    assert not still_loaded(prog_ids)


@dataclass
class WorkloadRun:
    before: str
    after: str


@pytest.fixture(scope="module")
def workload_run(served, unique_workloads, expo) -> WorkloadRun:
    """Runs the ground-truth workloads once while serving: demo for 2 s of CPU, calls 1234 times."""
    before = expo.scrape(served.url)
    subprocess.run([str(unique_workloads / "srvdemo"), "2"], check=True)
    subprocess.run([str(unique_workloads / "srvcalls"), "1234"], check=True, capture_output=True)
    subprocess.run([str(unique_workloads / "srvjit"), "1", "0.7"], check=True, capture_output=True)
    wait_for_drains(served.url, expo)
    return WorkloadRun(before, expo.scrape(served.url))


def increase(run: WorkloadRun, expo, name: str, **labels: str) -> float:
    return expo.value(run.after, name, **labels) - expo.value(run.before, name, **labels)


def test_hot_function_has_its_share_of_samples(workload_run, expo):
    total = increase(workload_run, expo, CPU, comm="srvdemo")
    assert 0.8 * 2 < total < 2.2  # 2 s of CPU (samples / 499 Hz), give or take lost samples
    shares = {symbol: increase(workload_run, expo, CPU, comm="srvdemo", symbol=symbol) / total
              for symbol in ("hot_a", "hot_b", "lib_burn", "demo::Hasher::mix(double)")}
    shares["lost"] = {reason: increase(workload_run, expo, "optrace_lost_samples_total", reason=reason)
                      for reason in ("user_stack_missing", "kernel_stack_missing", "counts_map_full")}
    rows = {dict(key)["dso"] + " " + dict(key)["symbol"]: value for key, value in
            expo.samples(workload_run.after, CPU).items() if dict(key)["comm"] == "srvdemo"}
    shares["rows"] = rows  # all of srvdemo's, to tell where a missing share went
    told = f"{shares}"  # a str: pytest prints it whole
    assert abs(shares["hot_a"] - 0.40) < 0.05, told
    assert abs(shares["hot_b"] - 0.20) < 0.05, told
    assert abs(shares["lib_burn"] - 0.20) < 0.05, told
    assert abs(shares["demo::Hasher::mix(double)"] - 0.20) < 0.05, told
    libburn = expo.samples(workload_run.after, CPU)
    assert any(dict(key)["symbol"] == "lib_burn" and dict(key)["dso"].endswith("/libburn.so") for key in libburn)


def test_exact_call_count(workload_run, unique_workloads, expo):
    binary = str(unique_workloads / "srvcalls")
    assert increase(workload_run, expo, CALLS, binary=binary, symbol="target", comm="srvcalls") == 1234
    assert expo.value(workload_run.after, CALLS, binary=binary) == 1234


def test_jit_symbols_are_named(workload_run, expo):
    """jitcode runs 70% of its CPU time in code it copied to anonymous memory and named in its perf map."""
    total = increase(workload_run, expo, CPU, comm="srvjit")
    jit = increase(workload_run, expo, CPU, comm="srvjit", dso="[jit]", symbol="jitcode::hot loop(long)")
    assert total > 0.8  # seconds: srvjit runs 1 s of CPU
    assert abs(jit / total - 0.70) < 0.07, (jit, total)


PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: optrace
    static_configs:
      - targets: ["{target}"]
"""


@pytest.fixture
def prometheus(served, tmp_path):
    """Debian's Prometheus on loopback, scraping the serve session every second."""
    target = urllib.parse.urlsplit(served.url).netloc
    (tmp_path / "prometheus.yml").write_text(PROMETHEUS_CONFIG.format(target=target))
    with running_prometheus(tmp_path / "prometheus.yml", tmp_path / "data") as server:
        yield server.base


def test_real_prometheus_ingests_the_counters(workload_run, prometheus, unique_workloads, expo):
    base = prometheus
    binary = str(unique_workloads / "srvcalls")
    calls = wait_for(lambda: query(base, f'{CALLS}{{binary="{binary}"}}'), 30, "prometheus to scrape")
    assert [(r["metric"]["symbol"], r["metric"]["comm"], r["value"][1]) for r in calls] == [("target", "srvcalls", "1234")]
    share = query(base, f'sum({CPU}{{comm="srvdemo",symbol="hot_a"}}) / sum({CPU}{{comm="srvdemo"}})')
    assert abs(float(share[0]["value"][1]) - 0.40) < 0.05
    top = wait_for(lambda: query(base, f"topk(10, sum by (symbol) (rate({CPU}[5m])))"), 10, "rates")
    assert len(top) == 10 and all(float(r["value"][1]) >= 0 for r in top)
    up = query(base, 'up{job="optrace"}')
    assert up[0]["value"][1] == "1"


def test_counters_stay_monotonic_while_processes_come_and_go(served, unique_workloads, expo):
    pages = [expo.samples(expo.scrape(served.url), CPU)]
    deadline = time.monotonic() + 4
    processes = 0
    while time.monotonic() < deadline:
        for _ in range(5):
            subprocess.run([str(unique_workloads / "srvshort"), "5"], check=True)
        processes += 5
        pages.append(expo.samples(expo.scrape(served.url, gzip_ok=True), CPU))
    wait_for_drains(served.url, expo)
    pages.append(expo.samples(expo.scrape(served.url), CPU))
    for earlier, later in zip(pages, pages[1:]):
        assert set(earlier) <= set(later)  # no series disappears
        assert all(later[key] >= value for key, value in earlier.items())
    short = {(dict(key)["dso"], dict(key)["symbol"]): v for key, v in pages[-1].items()
             if dict(key)["comm"] == "srvshort"}
    # naming the leaf of a process gone before its maps were read needs its exec event, which the
    # kernel's event buffer drops when the machine execs hundreds of processes a second: not asserted here
    assert sum(short.values()) > 0
    assert len(short) < processes / 2  # series per symbol (kernel ones included), not per process


def test_sigterm_exits_zero_and_detaches_everything(served):
    """Runs last in this module: stops the shared serve session."""
    pid = served.process.pid
    prog_ids = bpf_prog_ids(pid)
    assert prog_ids
    assert served.stop() == 0
    assert not still_loaded(prog_ids)
    assert f"bcc_{pid}" not in Path("/sys/kernel/tracing/uprobe_events").read_text()
    assert "Traceback" not in served.stderr_path.read_text()


def test_guard_and_memory_stay_bounded_as_processes_come_and_go(bpf_ready, unique_workloads, expo):
    """In-process daemon with the real sources: per-process state of exited processes is dropped,
    the guard caps the series, and stopping closes every BPF program it opened."""
    import threading

    from optrace.frontend.serve.daemon import ServeDaemon
    from optrace.frontend.serve.options import ServeOptions
    from optrace.frontend.serve.httpserver import ListenAddress
    from optrace.frontend.serve.sources import build_sources

    progs_before = bpf_prog_ids(os.getpid())
    options = ServeOptions(listen=ListenAddress("127.0.0.1", 0), frequency_hz=999, max_series=30, drain_interval_s=0.2)
    daemon = ServeDaemon(options, build_sources(options))
    stop = threading.Event()
    urls: list[str] = []
    thread = threading.Thread(target=daemon.run, args=(stop,), kwargs={"on_ready": urls.append})
    thread.start()
    try:
        wait_for(lambda: urls, 60, "the daemon to start")
        profile = daemon.sources[0]
        pids = []
        for _ in range(60):
            child = subprocess.Popen([str(unique_workloads / "srvshort"), "5"])
            child.wait()
            pids.append(child.pid)
        drains = daemon.totals.drains
        # samples whose stack copies wait for their process's tables come up to PENDING_DRAINS later: the
        # process is forgotten one drain after they came (frontend/unwind/copies.py)
        wait_for(lambda: daemon.totals.drains >= drains + PENDING_DRAINS + 3, 30, "the waiting samples' drains")
        session = profile.session
        tables = {"processes": session.tracker.pids(), "maps": set(session.symbolizer.machine.processes),
                  "jit": set(session.jit._procs)}
        assert {name: table & set(pids) for name, table in tables.items()} == {name: set() for name in tables}
        text = expo.scrape(urls[0])
        assert expo.value(text, "optrace_series", metric=CPU) == 30
        assert len(expo.samples(text, CPU)) == 30
        assert expo.value(text, "optrace_cardinality_overflow_total", metric=CPU) > 0
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert bpf_prog_ids(os.getpid()) <= progs_before


TLS_CONFIG = """
frequency: 199
max_series: 20
tls_cert: {cert}
tls_key: {key}
"""


def test_config_file_with_tls(bpf_ready, tmp_path, expo):
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    config = tmp_path / "serve.yaml"
    config.write_text(TLS_CONFIG.format(cert=cert, key=key))
    serve = start_serve(["--config", str(config)], tmp_path)
    try:
        assert serve.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        text = wait_for(lambda: (t := expo.scrape(serve.url, context=context)) and
                        expo.value(t, "optrace_drains_total") >= 2 and t, 20, "two drains over https")
        assert expo.value(text, "optrace_sampling_frequency_hertz") == 199
        assert 0 < len(expo.samples(text, CPU)) <= 20
    finally:
        assert serve.stop() == 0


def test_pid_filter_keeps_other_processes_out(bpf_ready, unique_workloads, tmp_path, expo):
    """-p: samples and calls of the given process only (a second srvcalls runs unprofiled beside it)."""
    target = subprocess.Popen([str(unique_workloads / "srvcalls"), "777", "0", "-"], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True)
    try:
        serve = start_serve(["-F", "999", "-p", str(target.pid), "--uprobe", f"{unique_workloads}/srvcalls:target"],
                            tmp_path)
        try:
            subprocess.run([str(unique_workloads / "srvcalls"), "555"], check=True, capture_output=True)
            subprocess.run([str(unique_workloads / "srvdemo"), "0.5"], check=True)
            target.communicate("go\n", timeout=30)
            wait_for_drains(serve.url, expo)
            text = expo.scrape(serve.url)
            assert expo.value(text, CALLS, binary=str(unique_workloads / "srvcalls")) == 777
            assert {dict(key)["comm"] for key in expo.samples(text, CPU)} <= {"srvcalls"}
        finally:
            assert serve.stop() == 0
    finally:
        target.kill()
        target.wait()


def scrape_status(url: str, user: str, password: str) -> int:
    import base64
    import urllib.error

    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_sighup_reloads_the_web_config_and_is_never_fatal(bpf_ready, tmp_path):
    """A running serve gets SIGHUP: a new basic-auth user works at once, the old one is refused; a
    broken, empty or world-writable web config on the next SIGHUP is one error line and the last good
    settings stay."""
    import bcrypt

    def users(name: str, password: str) -> str:
        return f"basic_auth_users:\n  {name}: {bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}\n"

    web = tmp_path / "web.yml"
    web.write_text(users("alice", "a"))
    serve = start_serve(["-F", "49", "--web-config", str(web)], tmp_path)
    try:
        wait_for(lambda: scrape_status(serve.url, "alice", "a") == 200, 30, "alice's scrape")
        assert scrape_status(serve.url, "bob", "b") == 401
        web.write_text(users("bob", "b"))
        serve.process.send_signal(signal.SIGHUP)
        wait_for(lambda: scrape_status(serve.url, "bob", "b") == 200, 10, "bob accepted after SIGHUP")
        assert scrape_status(serve.url, "alice", "a") == 401
        web.write_text("basic_auth_users:\n  carol: plaintext\n")
        for _ in range(5):
            serve.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload failed" in serve.stderr_path.read_text(), 10, "the reload warning")
        assert serve.process.poll() is None
        assert scrape_status(serve.url, "bob", "b") == 200
        err = serve.stderr_path.read_text()
        assert "reloaded the settings: serving http://127.0.0.1:" in err
        assert "not a bcrypt hash" in err and "Traceback" not in err
        web.write_text("")  # truncated (an editor, a failed copy): it reloaded as "no users", silently
        serve.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "has no settings" in serve.stderr_path.read_text(), 10, "the empty file's refusal")
        web.write_text(users("mallory", "m"))
        web.chmod(0o666)
        serve.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "writable by other users" in serve.stderr_path.read_text(), 10, "the open file's refusal")
        assert scrape_status(serve.url, "mallory", "m") == 401 and scrape_status(serve.url, "bob", "b") == 200
        refusals = [line for line in serve.stderr_path.read_text().splitlines() if "has no settings" in line
                    or "writable by other users" in line]
        assert len(refusals) == 2 and all(r.startswith("optrace: error: reload failed, still serving") for r in refusals)
    finally:
        assert serve.stop() == 0


def test_a_library_probe_says_how_many_processes_it_slows_down(bpf_ready, tmp_path):
    """`--uprobe c:getpid` without -p traps in every process that maps libc: serve says how many do now (at
    least the test's own 12 sleeps, whatever else the machine runs)."""
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    sleeps = [subprocess.Popen(["sleep", "120"]) for _ in range(12)]
    serve = start_serve(["-F", "49", "--comm", "nothing-here", "--uprobe", "c:getpid"], tmp_path)
    try:
        line = wait_for(lambda: re.search(r"optrace: warning: --uprobe c:getpid: (\d+) other processes map (\S+) now: "
                                          r"every call of getpid in them .* traps into the kernel",
                                          serve.stderr_path.read_text()), 30, "the warning")
        assert line.group(2) == libc and int(line.group(1)) >= len(sleeps)
    finally:
        assert serve.stop() == 0
        for sleep in sleeps:
            sleep.kill()
            sleep.wait()
