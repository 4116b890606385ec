"""Issue 8's table, live: an unprivileged user runs its hostile programs, root records and serves the machine.

The tests here are collected by test_live.py and test_live_million.py (``from livetests import *``),
each naming its GROUP of rows: one recording and one serve session per group.

All hostile processes burn CPU for the whole module (niced: 2 shared CPUs), so that root's
``record -a`` and ``serve`` sample them and go looking for their symbols. One recording and one serve
session are shared by every row; each row then checks that its process was met, and that it cost at most
its own names: the recording is complete, serve kept answering, nothing secret came out, peak RSS stayed
under 1 GB and nothing blocked longer than about a drain period.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import hostilefiles as hf
from hostilekit import (DRAIN_S, HostileUser, Measured, Running, Scrape, Secret, kill_group, loaded_prog_ids,
                        metric_sum, record_payload, run_measured, scrape, wait_for_line)

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

RECORD_SECONDS = 4
FINISH_S = 4  # after the loop: final drain, symbolizing every sampled process, writing the file
SERVE_SECONDS = 8
METRICS_MAX_BYTES = 16 << 20
CONCURRENT_SCRAPES = 100


# The million-name perf map gets a recording and a serve session of its own: reading it is the one
# row whose cost is in the drain itself, and it must not hide (or be hidden by) the other rows.
GROUPS = {
    "shared": ["ns_bind_mount", "ns_symlinked_tmp", "dt_needed_fifo", "kmsg_debuglink", "symtab_sh_link",
               "debugdata_bomb", "perfmap_blanks", "escape_name"],
    "million": ["million_names"],
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``key``: each row of the collecting module's GROUP."""
    if "key" in metafunc.fixturenames:
        metafunc.parametrize("key", GROUPS[metafunc.module.GROUP])




@dataclass
class Row:
    """One hostile process of the table, as root sees it."""

    key: str
    comm: str
    proc: subprocess.Popen  # what was started (setpriv..., the process itself unless in a namespace)
    map_size: int | None = None  # a JIT burner copying a perf map of this size to /tmp/perf-PID.map

    def pids(self, uid: int) -> set[int]:
        """Host pids of the processes called ``comm`` that run as ``uid``."""
        found = set()
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            except (OSError, ValueError):
                continue
            if fields.get("Name", "").strip() == self.comm and fields.get("Uid", "").split()[:1] == [str(uid)]:
                found.add(int(status.parent.name))
        return found

    def ready(self, uid: int) -> bool:
        """Running, and its perf map (if it writes one) complete."""
        pids = self.pids(uid)
        if not pids or self.map_size is None:
            return bool(pids)
        sizes = []
        for pid in pids:
            try:
                sizes.append(os.path.getsize(f"/tmp/perf-{pid}.map"))
            except OSError:
                return False
        return all(size == self.map_size for size in sizes)


class Starter:
    """Starts the table's rows as the hostile user."""

    NS = ("unshare", "-Urmpf", "--mount-proc", "sh", "-c")

    def __init__(self, user: HostileUser, bin_dir: Path, secret: Secret, zeros_xz: Path) -> None:
        self.user, self.bin, self.secret, self.zeros_xz = user, bin_dir, secret, zeros_xz

    def copy(self, name: str, source: str = "jitburn") -> Path:
        target = self.bin / name
        self.user.run("cp", self.bin / source, target)
        return target

    def jit(self, key: str, comm: str, data: bytes, slots: int) -> Row:
        """A JIT burner whose perf map is ``data`` (read because its samples fall in anonymous code)."""
        source = self.user.write(self.user.home / f"{comm}.map", data)
        return Row(key, comm, self.user.spawn(self.copy(comm), source, str(slots)), len(data))

    def ns_bind_mount(self) -> Row:
        """Its /tmp (a tmpfs of its own) holds perf-1.map: a bind mount of the root-only file."""
        binary = self.copy("hns-bind")
        script = (f"mount -t tmpfs tmpfs /tmp && : > /tmp/perf-1.map && "
                  f"mount --bind {self.secret.perf_map} /tmp/perf-1.map && exec {binary} - 4096")
        return Row("ns_bind_mount", "hns-bind", self.user.spawn(*self.NS, script))

    def ns_symlinked_tmp(self) -> Row:
        """Its root is a tmpfs whose tmp is a symlink to sec/, a bind mount of the root-only folder."""
        binary, root = self.copy("hns-symlink"), self.user.home / "nsroot"
        script = (f"mkdir -p {root} && mount -t tmpfs tmpfs {root} && mkdir {root}/sec && "
                  f"mount --bind {self.secret.folder} {root}/sec && ln -s sec {root}/tmp && cp {binary} {root}/ && "
                  f"exec chroot {root} /hns-symlink - 4096")
        return Row("ns_symlinked_tmp", "hns-symlink", self.user.spawn(*self.NS, script))

    def dt_needed_fifo(self) -> Row:
        """Exec'd again and again (a new program's DT_NEEDED are looked up at exec): $ORIGIN's copy of its
        library is a FIFO; the process itself loads the real one through LD_LIBRARY_PATH."""
        loop = f"while :; do {self.bin}/hneedfifo 0.5; done"
        return Row("dt_needed_fifo", "hneedfifo",
                   self.user.spawn("sh", "-c", loop, LD_LIBRARY_PATH=str(self.user.home / "reallib")))

    def elf(self, key: str, comm: str, binary: Path) -> Row:
        return Row(key, comm, self.user.spawn(binary))

    def start(self, key: str) -> Row:
        user, burn = self.user, self.bin / "burn"
        starters = {
            "ns_bind_mount": self.ns_bind_mount,
            "ns_symlinked_tmp": self.ns_symlinked_tmp,
            "dt_needed_fifo": self.dt_needed_fifo,
            "kmsg_debuglink": lambda: self.elf(key, "hkmsglink", hf.with_kmsg_debuglink(user, burn, self.bin / "hkmsglink")),
            "symtab_sh_link": lambda: self.elf(key, "hshlink", hf.with_symtab_link(user, burn, self.bin / "hshlink")),
            "debugdata_bomb": lambda: self.elf(key, "hdebugdata", hf.with_debugdata_bomb(
                user, burn, self.bin / "hdebugdata", self.zeros_xz)),
            "perfmap_blanks": lambda: self.jit(key, "hblanks", hf.blanks_map(), 4096),
            "million_names": lambda: self.jit(key, "hmillion", hf.million_names_map(), hf.MILLION),
            "escape_name": lambda: self.jit(key, "hescape", hf.escapes_map(), 4096),
        }
        return starters[key]()


def _wait_running(rows: dict[str, Row], uid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    pending = dict(rows)
    while pending and time.monotonic() < deadline:
        for key, row in list(pending.items()):
            if row.ready(uid):
                del pending[key]
            elif row.proc.poll() is not None:
                raise AssertionError(f"{key} exited {row.proc.returncode}: {row.proc.stderr.read().decode()}")
        time.sleep(0.1)
    assert not pending, f"hostile processes not running: {sorted(pending)}"


@pytest.fixture(scope="module")
def hostile_rows(request, bpf_ready, hostile_user, user_bin, secret, zeros_xz) -> dict[str, Row]:
    """The rows of the module's GROUP, running for as long as its tests."""
    starter = Starter(hostile_user, user_bin, secret, zeros_xz)
    rows: dict[str, Row] = {}
    try:
        for key in GROUPS[request.module.GROUP]:
            rows[key] = starter.start(key)
        _wait_running(rows, hostile_user.uid)
        yield rows
    finally:
        for row in rows.values():
            kill_group(row.proc)
            row.proc.stderr.close()


def group_of(rows: dict[str, Row]) -> str:
    return next(group for group, keys in GROUPS.items() if set(keys) == set(rows))


# -- one whole-machine recording -----------------------------------------------------------------------------
@dataclass
class Recorded:
    run: Measured
    path: Path
    report: dict
    report_run: Measured
    table_run: Measured
    payload: bytes


@pytest.fixture(scope="module")
def recorded(hostile_rows, tmp_path_factory) -> Recorded:
    tmp = tmp_path_factory.mktemp("hostile-record")
    out = tmp / "hostile.data"
    running = Running(["record", "-a", "-F", "99", "-d", str(RECORD_SECONDS), "-o", str(out)], tmp)
    running.wait_attached()
    run = running.finish(timeout=RECORD_SECONDS + 60)
    assert run.returncode == 0 and out.exists(), run.describe()
    report_run = run_measured(["report", "-i", str(out), "--format", "json", "--sort", "comm,pid,dso,symbol"], tmp)
    table_run = run_measured(["report", "-i", str(out), "--sort", "comm,dso,symbol"], tmp)
    assert report_run.returncode == 0, report_run.describe()
    print(f"\nFIGURES record {group_of(hostile_rows)}: wall {run.wall_s:.1f} s (attached at {run.attached_s:.1f} s, "
          f"loop {json.loads(report_run.stdout)['meta']['duration_s']} s), "
          f"peak RSS {run.peak_rss_kb >> 10} MB; report {report_run.wall_s:.1f} s, {report_run.peak_rss_kb >> 10} MB")
    return Recorded(run, out, json.loads(report_run.stdout), report_run, table_run, record_payload(out))


def test_record_completes_in_time_and_bounded(recorded):
    """The recording loop never stalled: it ended within two drain periods of ``-d`` (a drain stuck in
    a hostile file would push it out). Then the final drain, symbolization and write took a few seconds
    at most; exit 0, under 1 GB, no internal error, and every BPF program it loaded is gone."""
    run, meta = recorded.run, recorded.report["meta"]
    assert meta["system_wide"] and meta["total_samples"] > 0
    assert meta["duration_s"] <= RECORD_SECONDS + 2 * DRAIN_S, f"the recording loop stalled: {run.describe()}"
    run.assert_sane(max_wall_s=run.attached_s + RECORD_SECONDS + 2 * DRAIN_S + FINISH_S)
    assert run.prog_ids and not run.prog_ids & loaded_prog_ids()


def test_record_nothing_secret_anywhere(recorded, secret):
    secret.assert_absent(recorded.run.stderr, where="record's stderr")
    secret.assert_absent(recorded.payload, where="the record file")
    secret.assert_absent(recorded.report_run.stdout, recorded.table_run.stdout, where="report")


def test_record_warnings_are_one_line_each(recorded):
    for warning in recorded.report["meta"]["warnings"]:
        assert "\n" not in warning and "\x1b" not in warning and len(warning) < 400, warning


def test_row_met_and_contained_by_record(recorded, hostile_rows, hostile_user, secret, key):
    """The row's process is in the recording (it was sampled, so its files were looked at) and it cost
    at most its own names: no frame of it carries the secret, its warnings are one line."""
    row = hostile_rows[key]
    own = [r for r in recorded.report["rows"] if r["comm"] == row.comm]
    assert sum(r["samples"] for r in own) > 0, f"{row.comm} was never sampled"
    for r in own:
        assert secret.marker not in r["symbol"] and secret.marker not in r["dso"]
    if key.startswith("ns_"):  # refused whole: not even its line count may be told
        pids = row.pids(hostile_user.uid)
        about = [w for w in recorded.report["meta"]["warnings"] if any(f"/proc/{p}/" in w for p in pids)]
        assert not [w for w in about if "malformed" in w or "lines" in w], about


# -- one serve session ---------------------------------------------------------------------------------------
@dataclass
class Served:
    run: Measured
    scrapes: list[Scrape]
    concurrent: list[Scrape | Exception]
    drains: list[float]
    last_body: str


def _concurrent_scrapes(url: str) -> list[Scrape | Exception]:
    def one(_: int) -> Scrape | Exception:
        try:
            return scrape(url, timeout=60)
        except Exception as exc:  # noqa: BLE001 - recorded and asserted on
            return exc

    with ThreadPoolExecutor(CONCURRENT_SCRAPES) as pool:
        return list(pool.map(one, range(CONCURRENT_SCRAPES)))


@pytest.fixture(scope="module")
def served(hostile_rows, tmp_path_factory) -> Served:
    tmp = tmp_path_factory.mktemp("hostile-serve")
    running = Running(["serve", "--listen", "127.0.0.1:0", "-F", "499"], tmp)
    try:
        url = wait_for_line(running.err_path, r"serving (\S+)", running.proc).group(1)
        running.wait_attached()
        scrapes, drains = [], []
        deadline = time.monotonic() + SERVE_SECONDS
        while time.monotonic() < deadline:
            done = scrape(url, timeout=60)
            scrapes.append(done)
            drains.append(metric_sum(done.body.decode(errors="replace"), "optrace_drains_total"))
            time.sleep(0.5)
        concurrent = _concurrent_scrapes(url)
        last = scrape(url, timeout=60)
        scrapes.append(last)
    finally:
        run = running.finish(timeout=15, stop_signal=signal.SIGTERM)
    print(f"\nFIGURES serve {group_of(hostile_rows)}: peak RSS {run.peak_rss_kb >> 10} MB, slowest scrape "
          f"{max(x.seconds for x in scrapes):.2f} s, /metrics {len(last.body)} bytes, drains {drains}")
    return Served(run, scrapes, concurrent, drains, last.body.decode(errors="replace"))


def test_serve_kept_answering_and_draining(served):
    """Every scrape answered within two drain periods, and the drains went on (none stalled)."""
    assert all(s.status == 200 for s in served.scrapes)
    slowest = max(s.seconds for s in served.scrapes)
    assert slowest <= 2 * DRAIN_S, f"a scrape took {slowest:.1f} s"
    assert served.drains[-1] - served.drains[0] >= SERVE_SECONDS / DRAIN_S - 3, \
        f"drains seen: {served.drains}; {served.run.describe()}"


def test_serve_answers_100_concurrent_scrapes(served):
    failures = [s for s in served.concurrent if not isinstance(s, Scrape) or s.status != 200]
    assert not failures, f"{len(failures)} of {CONCURRENT_SCRAPES} scrapes failed: {failures[:3]}"


def test_serve_metrics_bounded_and_clean(served, secret):
    body = served.last_body
    assert len(body.encode()) < METRICS_MAX_BYTES, f"/metrics is {len(body) >> 20} MB"
    for s in served.scrapes + [c for c in served.concurrent if isinstance(c, Scrape)]:
        secret.assert_absent(s.body, where="/metrics")
        assert b"\x1b" not in s.body and b"\x07" not in s.body, "control characters in /metrics"
    secret.assert_absent(served.run.stderr, where="serve's stderr")


def test_serve_stops_bounded_and_clean(served):
    run = served.run
    run.assert_sane(max_wall_s=run.attached_s + SERVE_SECONDS + 120)
    assert run.returncode == 0, run.describe()
    assert run.prog_ids and not run.prog_ids & loaded_prog_ids()


def test_row_met_by_serve(served, hostile_rows, key):
    """The row's process shows up in /metrics: serve sampled it and survived it."""
    comms = set(re.findall(r'comm="([^"]*)"', served.last_body))
    assert hostile_rows[key].comm in comms, f"comms in /metrics: {sorted(comms)}"
