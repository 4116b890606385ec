"""Benchmark of `optrace serve`: scrape latency, and the exporter's own cost next to BCC's profile.

1. Scrape latency (p50/p99) at 1,000 and 10,000 series per metric: an exporter process serving
   synthetic totals where each drain (every 250 ms) changes 200 series per metric (what a 1 s drain
   at 99 Hz on 2 CPUs can change at most), scraped every 250 ms from this process with and without
   gzip (as Prometheus does), so nearly every scrape renders a new page; and the CPU time of the
   render alone (no HTTP), with 200 series changed and with every series changed.
2. Exporter CPU (% of one core, steady state, after the BPF compile) and RSS, whole machine at 99 Hz,
   while the demo workload keeps one core busy and the page is scraped every 5 s; side by side with
   BCC's `profile-bpfcc -F 99` over the same window, in the same run.

Run as root: `.venv/bin/python bench/bench_serve.py [--seconds 30]`. Writes bench/results/serve.json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPTRACE = Path(sys.executable).parent / "optrace"
BCC_PROFILE = "/usr/sbin/profile-bpfcc"
RESULTS = REPO / "bench" / "results" / "serve.json"
BENCH_BUDGET_S = 480  # read by bench/run.py (scrapes, then 30 s windows after compile and warm-up)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SYNTHETIC_DRAIN_S = 0.25
WARMUP_S = 10.0


# -- 1. scrape latency ------------------------------------------------------------------------------
CHANGED_PER_DRAIN = 200  # at 99 Hz on 2 CPUs a 1 s drain has at most ~200 samples: that many series change


class SyntheticSource:
    """`series` CPU series and `series` call series: all created by the first drain; then each drain
    bumps `changed` of them (rotating), or all of them with changed=None."""

    event = "cpu-clock"

    def __init__(self, series: int, changed: int | None = CHANGED_PER_DRAIN) -> None:
        self.series = series
        self.changed = changed
        self.next = 0

    def start(self) -> None:
        pass

    def collect(self, delta) -> None:
        count = self.series if self.changed is None or self.next == 0 else self.changed
        for j in range(self.next, self.next + count):
            i = j % self.series
            delta.cpu_samples[(f"comm{i % 50}", f"/usr/lib/x86_64-linux-gnu/libbench{i % 40}.so",
                               f"bench::Namespace::function_{i}(double, int)")] += 1
            delta.uprobe_calls[(f"/usr/bin/bench{i % 20}", f"probe_{i}", f"comm{i % 50}")] += 3
        self.next = (self.next + count) % self.series or 1

    def close(self) -> None:
        pass


def render_times(series: int, renders: int, changed: int | None) -> dict:
    """CPU time of the page render alone (no HTTP), each after a drain changed `changed` series."""
    from optrace.frontend.serve.metricspage import ExporterInfo, MetricsPage
    from optrace.frontend.serve.totals import Delta, ExporterTotals

    totals = ExporterTotals(2 * series)
    page = MetricsPage(totals, ExporterInfo(99, "cpu-clock"))
    source = SyntheticSource(series, changed)
    times = []
    for _ in range(renders + 1):
        delta = Delta()
        source.collect(delta)
        totals.apply(delta, drain_seconds=0)
        started = time.process_time()
        page.render()
        times.append((time.process_time() - started) * 1000)
    times = times[1:]  # the first render also builds every series' prefix, once per process
    return {"p50_ms": round(percentile(times, 50), 1), "p99_ms": round(percentile(times, 99), 1)}


def serve_synthetic(series: int) -> None:
    """Child mode: serve a SyntheticSource until killed."""
    from optrace.frontend.serve.daemon import ServeDaemon
    from optrace.frontend.serve.options import ServeOptions
    from optrace.frontend.serve.httpserver import ListenAddress

    options = ServeOptions(listen=ListenAddress("127.0.0.1", 0), max_series=2 * series,  # room past the [other] reserve
                           drain_interval_s=SYNTHETIC_DRAIN_S)
    daemon = ServeDaemon(options, [SyntheticSource(series)])
    stop = threading.Event()
    daemon.run(stop, on_ready=lambda url: print(url, flush=True))


def scrape_once(url: str, gzip_ok: bool) -> tuple[float, int]:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    elapsed = time.perf_counter() - started
    if gzip_ok:
        body = gzip.decompress(body)
    return elapsed, body.count(b"\n")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def bench_scrape(series: int, scrapes: int) -> dict:
    child = subprocess.Popen([sys.executable, __file__, "--serve-synthetic", str(series)],
                             stdout=subprocess.PIPE, text=True)
    try:
        url = child.stdout.readline().strip()
        time.sleep(0.5)
        result = {"series_per_metric": series, "render": render_times(series, scrapes, CHANGED_PER_DRAIN),
                  "render_all_changed": render_times(series, scrapes, None)}
        for gzip_ok in (False, True):
            times = []
            for _ in range(scrapes):
                elapsed, lines = scrape_once(url, gzip_ok)
                times.append(elapsed * 1000)
                time.sleep(SYNTHETIC_DRAIN_S)  # a drain changes the totals: most scrapes render a new page
            key = "gzip" if gzip_ok else "plain"
            result[key] = {"p50_ms": round(percentile(times, 50), 1), "p99_ms": round(percentile(times, 99), 1),
                           "max_ms": round(max(times), 1), "lines": lines}
        return result
    finally:
        child.terminate()
        child.wait(10)


# -- 2. CPU and RSS next to BCC's profile -----------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def rss_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    return round(rss, 1), round(peak, 1)


def wait_ready(process: subprocess.Popen, stderr_path: Path, pattern: str, timeout: float = 90) -> re.Match | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, stderr_path.read_text())
        if found:
            return found
        if process.poll() is not None:
            raise SystemExit(f"{process.args[0]} exited: {stderr_path.read_text()}")
        time.sleep(0.2)
    raise SystemExit(f"{process.args[0]} did not start: {stderr_path.read_text()}")


def measure_window(pid: int, seconds: float, during=None) -> dict:
    """CPU use of `pid` over `seconds` (calling `during()` every 5 s), and its RSS at the end."""
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    next_call = start
    while (elapsed := time.monotonic() - start) < seconds:
        if during and time.monotonic() >= next_call:
            during()
            next_call += 5.0
        time.sleep(min(0.5, max(seconds - elapsed, 0.0)))
    cpu = cpu_seconds(pid) - start_cpu
    wall = time.monotonic() - start
    rss, peak = rss_mb(pid)
    return {"cpu_percent_of_one_core": round(100 * cpu / wall, 2), "window_s": round(wall, 1),
            "rss_mb": rss, "peak_rss_mb": peak}


def bench_optrace(seconds: float, tmp: Path) -> dict:
    err = tmp / "serve.err"
    with open(err, "w") as stderr:
        process = subprocess.Popen([str(OPTRACE), "serve", "--listen", "127.0.0.1:0", "-F", "99"],
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        url = wait_ready(process, err, r"serving (\S+)").group(1)
        time.sleep(WARMUP_S)  # past the first drains, which load the symbol tables of what runs
        scrapes = Counter()

        def scrape() -> None:
            elapsed, lines = scrape_once(url, gzip_ok=True)
            scrapes["count"] += 1
            scrapes["lines"] = lines

        before = exporter_counters(url)
        result = measure_window(process.pid, seconds, during=scrape)
        result["load_average"] = os.getloadavg()[0]
        after = exporter_counters(url)
        window = result["window_s"]
        result["scrapes"] = scrapes["count"]
        result["page_lines"] = scrapes["lines"]
        result["execs_per_s"] = round((after.get("exec", 0) - before.get("exec", 0)) / window, 1)
        result["series_at_end"] = int(after["series"])
        for name in ("drain_seconds", "symbolize_seconds"):
            key = f"optrace_{name}_total"
            result[f"{name}_per_s"] = round((after.get(key, 0) - before.get(key, 0)) / window, 4)
        return result
    finally:
        process.terminate()
        process.wait(30)


def exporter_counters(url: str) -> dict[str, float]:
    """The exporter's self-metrics that explain its cost (unlabelled ones, and process events by event)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(optrace_\w+_total) (\S+)$", text, re.M)}
    for m in re.finditer(r'^optrace_process_events_total\{event="(\w+)"\} (\S+)$', text, re.M):
        found[m.group(1)] = float(m.group(2))
    series = re.search(r'^optrace_series\{metric="optrace_cpu_seconds_total"\} (\S+)$', text, re.M)
    found["series"] = float(series.group(1)) if series else 0.0
    return found


def bench_bcc_profile(seconds: float, tmp: Path) -> dict:
    err = tmp / "bcc.err"
    out = tmp / "bcc.out"
    with open(err, "w") as stderr, open(out, "w") as stdout:
        process = subprocess.Popen([BCC_PROFILE, "-F", "99", "-f"], stdout=stdout, stderr=stderr)
    try:
        deadline = time.monotonic() + 90
        while not bpf_attached(process.pid) and time.monotonic() < deadline:  # it prints nothing when ready
            time.sleep(0.2)
        time.sleep(3)
        result = measure_window(process.pid, seconds)
        result["load_average"] = os.getloadavg()[0]
        before_end = end_cpu = cpu_seconds(process.pid)
        peak = result["peak_rss_mb"]
        process.send_signal(2)  # SIGINT: it reads and symbolizes the stacks, prints them, exits
        started = time.monotonic()
        while process.poll() is None:  # sampled until it exits: its last readings stand for the end
            try:
                end_cpu = cpu_seconds(process.pid)
                peak = max(peak, rss_mb(process.pid)[1])
            except (OSError, AttributeError):
                break
            time.sleep(0.05)
        process.wait(60)
        result["report_cpu_s"] = round(end_cpu - before_end, 2)
        result["report_wall_s"] = round(time.monotonic() - started, 2)
        result["peak_rss_mb"] = peak
        return result
    finally:
        if process.poll() is None:
            process.kill()


def bpf_attached(pid: int) -> bool:
    for fdinfo in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            if "prog_id:" in fdinfo.read_text():
                return True
        except OSError:
            pass
    return False


def markdown(results: dict) -> str:
    lines = ["## optrace serve", "",
             f"Scrape latency: HTTP GET of /metrics from another process, a new page rendered for nearly every "
             f"scrape (load average {results['scrape_load_average']:.1f} on {results['machine']['cpus']} CPUs); "
             f"render = CPU time of the page alone, {CHANGED_PER_DRAIN} or all series changed since the last one:", "",
             "| series per metric | lines | render p50 / p99 | render, all changed, p50 / p99 | plain p50 / p99 | "
             "gzip p50 / p99 |", "|---:|---:|---:|---:|---:|---:|"]
    for row in results["scrape"]:
        cells = [row["render"], row["render_all_changed"], row["plain"], row["gzip"]]
        lines.append(f"| {row['series_per_metric']:,} | {row['plain']['lines']:,} | "
                     + " | ".join(f"{c['p50_ms']} / {c['p99_ms']} ms" for c in cells) + " |")
    o, b = results["optrace_serve"], results["bcc_profile"]
    bcc_total = round(100 * b["report_cpu_s"] / b["window_s"], 2)
    lines += ["", f"Whole machine at 99 Hz, {o['window_s']} s steady-state window each (after the BPF compile "
              f"and {WARMUP_S:.0f} s of warm-up), "
              f"demo workload busy on one core; the machine exec'd {o['execs_per_s']} processes/s during optrace's "
              f"window (load average {o['load_average']:.1f}, then {b['load_average']:.1f}):", "",
              "| tool | CPU (% of one core) | RSS | peak RSS | notes |", "|---|---:|---:|---:|---|",
              f"| optrace serve -F 99 | {o['cpu_percent_of_one_core']} % | {o['rss_mb']} MB | {o['peak_rss_mb']} MB | "
              f"drains every 1 s: {o['drain_seconds_per_s']:.4f} s/s in drains, {o['symbolize_seconds_per_s']:.4f} s/s "
              f"symbolizing; {o['series_at_end']} CPU series; {o['scrapes']} scrapes |",
              f"| profile-bpfcc -F 99 -f | {b['cpu_percent_of_one_core']} % ({bcc_total} % with its final read) | "
              f"{b['rss_mb']} MB | {b['peak_rss_mb']} MB | reads the kernel only at exit: {b['report_cpu_s']} s CPU then |"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="steady-state window per tool")
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per series count and encoding")
    parser.add_argument("--serve-synthetic", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_synthetic:
        serve_synthetic(args.serve_synthetic)
        return
    if os.geteuid() != 0:
        raise SystemExit("bench_serve.py needs root (BPF): run with sudo")
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-serve-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "workloads")], check=True)
    results = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
               "scrape": [bench_scrape(n, args.scrapes) for n in (1000, 10000)],
               "scrape_load_average": os.getloadavg()[0]}
    demo = subprocess.Popen([str(REPO / "workloads" / "build" / "demo"), str(args.seconds * 3 + 120)],
                            stdout=subprocess.DEVNULL)
    try:
        results["optrace_serve"] = bench_optrace(args.seconds, tmp)
        results["bcc_profile"] = bench_bcc_profile(args.seconds, tmp)
    finally:
        demo.kill()
        demo.wait()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
