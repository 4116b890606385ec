"""Issue 8's table, live: an unprivileged user runs its hostile programs, root records and serves the machine.

The tests here are collected by test_live.py and test_live_million.py (``from livetests import *``),
each naming its GROUP of rows: one recording and one serve session per group.

The group's hostile processes burn CPU for as long as its tests run (niced: 2 shared CPUs), so that
root's ``record -a`` and ``serve`` sample them and go looking for their symbols. Each row then checks
that its process was met and cost at most its own names; the group's tests check that the recording is
complete, serve kept answering, nothing secret came out, peak RSS stayed under 1 GB and nothing blocked
longer than about a drain period.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import hostilefiles as hf
from hostilekit import (DRAIN_S, HostileUser, Measured, Running, Scrape, Secret, kill_group, still_loaded,
                        metric_sum, record_payload, remove_perf_maps, run_measured, scrape, wait_for_line)

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

RECORD_SECONDS = 6  # the rows start after it attached (about a second to get going)
FINISH_S = 4  # after the loop: final drain, symbolizing every sampled process, writing the file
SERVE_SECONDS = 8
SERVE_MAX_SECONDS = 40
METRICS_MAX_BYTES = 16 << 20
CONCURRENT_SCRAPES = 100


# The million-name perf map gets a recording and a serve session of its own: reading it is the one
# row whose cost is in the drain itself, and it must not hide (or be hidden by) the other rows.
GROUPS = {
    "shared": ["ns_bind_mount", "ns_symlinked_tmp", "dt_needed_fifo", "kmsg_debuglink", "symtab_sh_link",
               "debugdata_bomb", "perfmap_blanks", "escape_name"],
    "million": ["million_names"],
}

# Not a row: the user's ordinary program (symbols intact), run beside the rows. Its samples must be
# named as usual: a hostile file costs its own names, never another program's.
CONTROL = "control"
CONTROL_SYMBOL = "hostile_burn"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``key``: each row of the collecting module's GROUP."""
    if "key" in metafunc.fixturenames:
        metafunc.parametrize("key", GROUPS[metafunc.module.GROUP])




@dataclass(frozen=True)
class Plan:
    """How to start one row's process as the user (its files already made)."""

    key: str
    comm: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    map_size: int | None = None  # a JIT burner copying a perf map of this size to /tmp/perf-PID.map


@dataclass
class Row:
    """One hostile process of the table, as root sees it."""

    plan: Plan
    proc: subprocess.Popen  # what was started (setpriv...: the process itself unless in a namespace)
    pids: set[int] = field(default_factory=set)  # host pids of its processes, seen while it ran

    @property
    def comm(self) -> str:
        return self.plan.comm

    def look(self, uid: int) -> bool:
        """Running (its pids noted), and its perf map (if it writes one) complete."""
        found = _pids_of(self.comm, uid)
        self.pids |= found
        if not found or self.plan.map_size is None:
            return bool(found)
        try:
            return all(os.path.getsize(f"/tmp/perf-{pid}.map") == self.plan.map_size for pid in found)
        except OSError:
            return False


def _pids_of(comm: str, uid: int) -> set[int]:
    """Host pids of the processes called ``comm`` that run as ``uid``."""
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except (OSError, ValueError):
            continue
        if fields.get("Name", "").strip() == comm and fields.get("Uid", "").split()[:1] == [str(uid)]:
            found.add(int(status.parent.name))
    return found


class Planner:
    """Makes the table's hostile files as the user, and says how to run each row."""

    NS = ("unshare", "-Urmpf", "--mount-proc", "sh", "-c")

    def __init__(self, user: HostileUser, bin_dir: Path, secret: Secret, zeros_xz: Path) -> None:
        self.user, self.bin, self.secret, self.zeros_xz = user, bin_dir, secret, zeros_xz

    def copy(self, name: str, source: str = "jitburn") -> str:
        target = self.bin / name
        self.user.run("cp", self.bin / source, target)
        return str(target)

    def burner(self, name: str) -> Path:
        """programs/burn.c built as ``name`` with a build-id of its own: optrace knows an ELF file by its
        build-id, so rows made from one build would be looked at once, as whichever it met first."""
        target = self.bin / name
        build_id = hashlib.sha1(name.encode()).hexdigest()
        self.user.run("gcc", "-O1", "-fno-omit-frame-pointer", "-g", f"-Wl,--build-id=0x{build_id}", "-o", target,
                      self.user.home / "src" / "burn.c")
        return target

    def jit(self, key: str, comm: str, data: bytes, slots: int) -> Plan:
        """A JIT burner whose perf map is ``data`` (read because its samples fall in anonymous code)."""
        source = self.user.write(self.user.home / f"{comm}.map", data)
        return Plan(key, comm, (self.copy(comm), str(source), str(slots)), map_size=len(data))

    def ns_bind_mount(self) -> Plan:
        """Its /tmp (a tmpfs of its own) holds perf-1.map: a bind mount of the root-only file."""
        binary = self.copy("hns-bind")
        script = (f"mount -t tmpfs tmpfs /tmp && : > /tmp/perf-1.map && "
                  f"mount --bind {self.secret.perf_map} /tmp/perf-1.map && exec {binary} - 4096")
        return Plan("ns_bind_mount", "hns-bind", (*self.NS, script))

    def ns_symlinked_tmp(self) -> Plan:
        """Its root is a tmpfs whose tmp is a symlink to sec/, a bind mount of the root-only folder."""
        binary, root = self.copy("hns-symlink"), self.user.home / "nsroot"
        self.user.run("mkdir", "-p", root)
        script = (f"mount -t tmpfs tmpfs {root} && mkdir {root}/sec && mount --bind {self.secret.folder} {root}/sec"
                  f" && ln -s sec {root}/tmp && cp {binary} {root}/ && exec chroot {root} /hns-symlink - 4096")
        return Plan("ns_symlinked_tmp", "hns-symlink", (*self.NS, script))

    def dt_needed_fifo(self) -> Plan:
        """Exec'd again and again (a new program's DT_NEEDED are looked up at exec): $ORIGIN's copy of its
        library is a FIFO; the process itself loads the real one through LD_LIBRARY_PATH."""
        loop = f"while :; do {self.bin}/hneedfifo 0.5; done"
        return Plan("dt_needed_fifo", "hneedfifo", ("sh", "-c", loop),
                    (("LD_LIBRARY_PATH", str(self.user.home / "reallib")),))

    def plan(self, key: str) -> Plan:
        user = self.user
        planners = {
            "ns_bind_mount": self.ns_bind_mount,
            "ns_symlinked_tmp": self.ns_symlinked_tmp,
            "dt_needed_fifo": self.dt_needed_fifo,
            "kmsg_debuglink": lambda: Plan(key, "hkmsglink", (str(hf.with_kmsg_debuglink(
                user, self.burner("kmsg.orig"), self.bin / "hkmsglink")),)),
            "symtab_sh_link": lambda: Plan(key, "hshlink", (str(hf.with_symtab_link(
                user, self.burner("shlink.orig"), self.bin / "hshlink")),)),
            "debugdata_bomb": lambda: Plan(key, "hdebugdata", (str(hf.with_debugdata_bomb(
                user, self.burner("debugdata.orig"), self.bin / "hdebugdata", self.zeros_xz)),)),
            "perfmap_blanks": lambda: self.jit(key, "hblanks", hf.blanks_map(), 4096),
            "million_names": lambda: self.jit(key, "hmillion", hf.million_names_map(), hf.MILLION),
            "escape_name": lambda: self.jit(key, "hescape", hf.escapes_map(), 4096),
            CONTROL: lambda: Plan(key, "hcontrol", (str(self.burner("hcontrol")),)),
        }
        return planners[key]()


class Rows:
    """The group's rows: files made once; processes started while an optrace process runs (so that
    meeting them happens in its drains, which are measured), stopped after it."""

    def __init__(self, user: HostileUser, plans: list[Plan]) -> None:
        self.user, self.plans = user, plans
        self.running: dict[str, Row] = {}

    def start(self, timeout: float = 60) -> None:
        for plan in self.plans:
            self.running[plan.key] = Row(plan, self.user.spawn(*plan.argv, **dict(plan.env)))
        deadline = time.monotonic() + timeout
        pending = dict(self.running)
        while pending and time.monotonic() < deadline:
            for key, row in list(pending.items()):
                if row.look(self.user.uid):
                    del pending[key]
                elif row.proc.poll() is not None:
                    raise AssertionError(f"{key} exited {row.proc.returncode}: {row.proc.stderr.read().decode()}")
            time.sleep(0.1)
        assert not pending, f"hostile processes not running: {sorted(pending)}"

    def stop(self) -> dict[str, Row]:
        """Kill them (their pids noted once more first: the exec loop's change); the rows as they ran."""
        rows, self.running = self.running, {}
        for row in rows.values():
            row.look(self.user.uid)
            kill_group(row.proc)
            row.proc.stderr.close()
        remove_perf_maps(self.user.uid)
        return rows


@pytest.fixture(scope="module")
def hostile_rows(request, bpf_ready, hostile_user, user_bin, secret, zeros_xz) -> Rows:
    """The rows of the module's GROUP, ready to start."""
    planner = Planner(hostile_user, user_bin, secret, zeros_xz)
    rows = Rows(hostile_user, [planner.plan(key) for key in [*GROUPS[request.module.GROUP], CONTROL]])
    yield rows
    rows.stop()


def group_of(rows: Rows) -> str:
    return next(group for group, keys in GROUPS.items() if [*keys, CONTROL] == [plan.key for plan in rows.plans])


# -- one whole-machine recording -----------------------------------------------------------------------------
@dataclass
class Recorded:
    run: Measured
    rows: dict[str, Row]
    path: Path
    report: dict
    report_run: Measured
    table_run: Measured
    payload: bytes


@pytest.fixture(scope="module")
def recorded(hostile_rows, tmp_path_factory) -> Recorded:
    """``record -a`` for RECORD_SECONDS; the rows start once it has attached."""
    tmp = tmp_path_factory.mktemp("hostile-record")
    out = tmp / "hostile.data"
    running = Running(["record", "-a", "-F", "99", "-d", str(RECORD_SECONDS), "-o", str(out)], tmp)
    try:
        running.wait_attached()
        hostile_rows.start()
    finally:
        run = running.finish(timeout=RECORD_SECONDS + 60)
        rows = hostile_rows.stop()
    assert run.returncode == 0 and out.exists(), run.describe()
    report_run = run_measured(["report", "-i", str(out), "--format", "json", "--sort", "comm,pid,dso,symbol"], tmp)
    table_run = run_measured(["report", "-i", str(out), "--sort", "comm,dso,symbol"], tmp)
    assert report_run.returncode == 0, report_run.describe()
    report = json.loads(report_run.stdout)
    print(f"\nFIGURES record {group_of(hostile_rows)}: wall {run.wall_s:.1f} s (attached at {run.attached_s:.1f} s, last program at {run.loaded_s:.1f} s, "
          f"loop {report['meta']['duration_s']} s), peak RSS {run.peak_rss_kb >> 10} MB; "
          f"report {report_run.wall_s:.1f} s, {report_run.peak_rss_kb >> 10} MB")
    return Recorded(run, rows, out, report, report_run, table_run, record_payload(out))


def test_record_completes_in_time_and_bounded(recorded):
    """The recording loop never stalled: it ended within two drain periods of ``-d`` (a drain stuck in
    a hostile file would push it out). Then the final drain, symbolization and write took a few seconds
    at most; exit 0, under 1 GB, no internal error, and every BPF program it loaded is gone."""
    run, meta = recorded.run, recorded.report["meta"]
    assert meta["system_wide"] and meta["total_samples"] > 0
    assert meta["duration_s"] <= RECORD_SECONDS + 2 * DRAIN_S, \
        f"the recording loop took {meta['duration_s']} s for -d {RECORD_SECONDS}: {run.describe()}"
    run.assert_sane(max_wall_s=run.loaded_s + RECORD_SECONDS + 2 * DRAIN_S + FINISH_S)
    assert run.prog_ids and not still_loaded(run.prog_ids)


def test_record_nothing_secret_anywhere(recorded, secret):
    secret.assert_absent(recorded.run.stderr, where="record's stderr")
    secret.assert_absent(recorded.payload, where="the record file")
    secret.assert_absent(recorded.report_run.stdout, recorded.table_run.stdout, where="report")


def test_record_warnings_are_one_line_each(recorded):
    for warning in recorded.report["meta"]["warnings"]:
        assert "\n" not in warning and "\x1b" not in warning and len(warning) < 400, warning


def test_row_met_and_contained_by_record(recorded, secret, key):
    """The row's process is in the recording (it was sampled, so its files were looked at) and it cost
    at most its own names: no frame of it carries the secret, its warnings are one line."""
    row = recorded.rows[key]
    own = [r for r in recorded.report["rows"] if r["comm"] == row.comm]
    assert sum(r["samples"] for r in own) > 0, f"{row.comm} was never sampled"
    for r in own:
        assert secret.marker not in r["symbol"] and secret.marker not in r["dso"]
    if key.startswith("ns_"):  # refused whole: not even its line count may be told
        about = [w for w in recorded.report["meta"]["warnings"] if any(f"/proc/{p}/" in w for p in row.pids)]
        assert not [w for w in about if "malformed" in w or "lines" in w], about


def test_control_process_named_in_record(recorded):
    own = [r for r in recorded.report["rows"] if r["comm"] == "hcontrol"]
    named = sum(r["samples"] for r in own if r["symbol"] == CONTROL_SYMBOL)
    assert named > 0.8 * sum(r["samples"] for r in own) > 0, own


# -- one serve session ---------------------------------------------------------------------------------------
@dataclass
class Served:
    run: Measured
    scrapes: list[Scrape]
    concurrent: list[Scrape | Exception]
    drains: list[tuple[float, float]]  # (seconds since the first scrape, optrace_drains_total)
    last_body: str

    def longest_drain_gap(self) -> float:
        """The longest time the drain count stood still, as seen by the scrapes."""
        changed_at, count, worst = self.drains[0][0], self.drains[0][1], 0.0
        for at, drains in self.drains[1:]:
            if drains != count:
                changed_at, count = at, drains
            worst = max(worst, at - changed_at)
        return worst


def _concurrent_scrapes(url: str) -> list[Scrape | Exception]:
    def one(_: int) -> Scrape | Exception:
        try:
            return scrape(url, timeout=60)
        except Exception as exc:  # noqa: BLE001 - recorded and asserted on
            return exc

    with ThreadPoolExecutor(CONCURRENT_SCRAPES) as pool:
        return list(pool.map(one, range(CONCURRENT_SCRAPES)))


def _comms(body: str) -> set[str]:
    return set(re.findall(r'comm="([^"]*)"', body))


@pytest.fixture(scope="module")
def served(hostile_rows, tmp_path_factory) -> Served:
    """``serve``; once it has drained once (its start-up is not the rows' doing), the rows start, and
    it is scraped every half second for SERVE_SECONDS, and on until every row's process is in /metrics
    (the machine is shared: niced burners may wait for CPU) or SERVE_MAX_SECONDS; then 100 at once,
    then a SIGHUP and a last scrape."""
    tmp = tmp_path_factory.mktemp("hostile-serve")
    running = Running(["serve", "--listen", "127.0.0.1:0", "-F", "499"], tmp)
    wanted = {plan.comm for plan in hostile_rows.plans}
    try:
        url = wait_for_line(running.err_path, r"serving (\S+)", running.proc).group(1)
        running.wait_attached()
        _wait_first_drain(url)
        hostile_rows.start()
        scrapes, drains = [], []
        started = time.monotonic()
        while True:
            done = scrape(url, timeout=60)
            body = done.body.decode(errors="replace")
            scrapes.append(done)
            drains.append((time.monotonic() - started, metric_sum(body, "optrace_drains_total")))
            elapsed = time.monotonic() - started
            if elapsed > SERVE_MAX_SECONDS or (elapsed > SERVE_SECONDS and wanted <= _comms(body)):
                break
            time.sleep(0.5)
        concurrent = _concurrent_scrapes(url)
        running.signal(signal.SIGHUP)  # reloads its settings (or ignores it): never fatal
        time.sleep(2 * DRAIN_S)
        last = scrape(url, timeout=60)
        scrapes.append(last)
    finally:
        run = running.finish(timeout=15, stop_signal=signal.SIGTERM)
        hostile_rows.stop()
    result = Served(run, scrapes, concurrent, drains, last.body.decode(errors="replace"))
    print(f"\nFIGURES serve {group_of(hostile_rows)}: peak RSS {run.peak_rss_kb >> 10} MB, slowest scrape "
          f"{max(x.seconds for x in scrapes):.2f} s, /metrics {len(last.body)} bytes, {drains[-1][1]:.0f} drains "
          f"in {drains[-1][0]:.1f} s, longest drain gap {result.longest_drain_gap():.1f} s, "
          f"stopped in {run.stop_s:.1f} s")
    return result


def _wait_first_drain(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while metric_sum(scrape(url).body.decode(errors="replace"), "optrace_drains_total") < 1:
        assert time.monotonic() < deadline, "serve never drained"
        time.sleep(0.2)


def test_serve_kept_answering_and_draining(served):
    """Every scrape answered within two drain periods, and no drain stood still for longer than two
    drain periods (plus the scrape interval)."""
    assert all(s.status == 200 for s in served.scrapes)
    slowest = max(s.seconds for s in served.scrapes)
    assert slowest <= 2 * DRAIN_S, f"a scrape took {slowest:.1f} s"
    gap = served.longest_drain_gap()
    assert gap <= 2 * DRAIN_S + 1, f"drains stood still for {gap:.1f} s: {served.drains}; {served.run.describe()}"


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
    """SIGTERM is obeyed within two drain periods (a drain stuck in a FIFO or /proc/kmsg would not be);
    exit 0, under 1 GB, and every BPF program it loaded is gone."""
    run = served.run
    run.assert_sane(max_wall_s=run.attached_s + SERVE_MAX_SECONDS + 120)
    assert run.returncode == 0, run.describe()
    assert run.stop_s <= 2 * DRAIN_S + 1, f"SIGTERM took {run.stop_s:.1f} s: {run.describe()}"
    assert run.prog_ids and not still_loaded(run.prog_ids)


def test_serve_survives_sighup(served):
    assert served.scrapes[-1].status == 200 and served.run.returncode == 0, served.run.describe()


def test_control_process_named_by_serve(served):
    assert re.search(r'optrace_cpu_seconds_total\{[^}]*comm="hcontrol"[^}]*symbol="%s"' % CONTROL_SYMBOL,
                     served.last_body), "the ordinary program beside the rows lost its names"


def test_row_met_by_serve(served, hostile_rows, key):
    """The row's process shows up in /metrics: serve sampled it and survived it."""
    comms = _comms(served.last_body)
    assert next(p.comm for p in hostile_rows.plans if p.key == key) in comms, f"comms in /metrics: {sorted(comms)}"
