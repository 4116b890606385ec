"""Issue 8's table, live: an unprivileged user runs its hostile programs, root records and serves the machine.

All hostile processes burn CPU for the whole module (niced: 2 shared CPUs), so that root's
``record -a`` and ``serve`` sample them and go looking for their symbols. One recording and one serve
session are shared by every row; each row then checks that its process was met, and that it cost at most
its own names: the recording is complete, serve kept answering, nothing secret came out, peak RSS stayed
under 1 GB and nothing blocked longer than about a drain period.
"""
from __future__ import annotations

import json
import os
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
SERVE_SECONDS = 8
METRICS_MAX_BYTES = 16 << 20
CONCURRENT_SCRAPES = 100


@dataclass
class Row:
    """One hostile process of the table, as root sees it."""

    key: str
    comm: str
    proc: subprocess.Popen  # what was started (setpriv..., the process itself unless in a namespace)
    jit_map: bool  # a JIT burner: its perf map is read because its samples fall in anonymous code

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


ROW_KEYS = ["ns_bind_mount", "ns_symlinked_tmp", "dt_needed_fifo", "kmsg_debuglink", "symtab_sh_link",
            "debugdata_bomb", "perfmap_blanks", "million_names", "escape_name"]


def _start_rows(user: HostileUser, bin_dir: Path, secret: Secret, zeros_xz: Path) -> dict[str, Row]:
    home, jitburn, burn = user.home, bin_dir / "jitburn", bin_dir / "burn"
    maps = {"blanks": hf.blanks_map(), "million": hf.million_names_map(), "escape": hf.escapes_map()}
    for name, data in maps.items():
        user.write(home / f"{name}.map", data)

    def copy(source: Path, name: str) -> Path:
        target = bin_dir / name
        user.run("cp", source, target)
        return target

    ns = ["unshare", "-Urmpf", "--mount-proc", "sh", "-c"]
    bind = copy(jitburn, "hns-bind")
    symlinked = copy(jitburn, "hns-symlink")
    rows = [
        # its /tmp (a tmpfs of its own) holds perf-1.map: a bind mount of the root-only file
        Row("ns_bind_mount", "hns-bind", user.spawn(*ns, "mount -t tmpfs tmpfs /tmp && : > /tmp/perf-1.map && "
                                                    f"mount --bind {secret.perf_map} /tmp/perf-1.map && "
                                                    f"exec {bind} - 4096"), True),
        # its root is a tmpfs whose tmp is a symlink to sec/, a bind mount of the root-only folder
        Row("ns_symlinked_tmp", "hns-symlink", user.spawn(
            *ns, f"R={home}/nsroot && mkdir -p $R && mount -t tmpfs tmpfs $R && mkdir $R/sec && "
            f"mount --bind {secret.folder} $R/sec && ln -s sec $R/tmp && cp {symlinked} $R/ && "
            "exec chroot $R /hns-symlink - 4096"), True),
        # exec'd again and again: a new program's DT_NEEDED are looked up at exec; $ORIGIN's copy is a FIFO
        Row("dt_needed_fifo", "hneedfifo", user.spawn("sh", "-c", f"while :; do {bin_dir}/hneedfifo 0.5; done",
                                                      LD_LIBRARY_PATH=str(home / "reallib")), False),
        Row("kmsg_debuglink", "hkmsglink", user.spawn(hf.with_kmsg_debuglink(user, burn, bin_dir / "hkmsglink")),
            False),
        Row("symtab_sh_link", "hshlink", user.spawn(hf.with_symtab_link(user, burn, bin_dir / "hshlink")), False),
        Row("debugdata_bomb", "hdebugdata", user.spawn(
            hf.with_debugdata_bomb(user, burn, bin_dir / "hdebugdata", zeros_xz)), False),
        Row("perfmap_blanks", "hblanks", user.spawn(copy(jitburn, "hblanks"), home / "blanks.map", "4096"), True),
        Row("million_names", "hmillion", user.spawn(copy(jitburn, "hmillion"), home / "million.map",
                                                    str(hf.MILLION)), True),
        Row("escape_name", "hescape", user.spawn(copy(jitburn, "hescape"), home / "escape.map", "4096"), True),
    ]
    return {row.key: row for row in rows}


def _wait_running(rows: dict[str, Row], uid: int, timeout: float = 60) -> None:
    """Every row's process runs (and a JIT burner has written its perf map, or is in its namespace)."""
    deadline = time.monotonic() + timeout
    pending = dict(rows)
    while pending and time.monotonic() < deadline:
        for key, row in list(pending.items()):
            pids = row.pids(uid)
            ready = pids and (not row.jit_map or key.startswith("ns_") or
                              all(os.path.exists(f"/tmp/perf-{pid}.map") for pid in pids))
            if ready:
                del pending[key]
            elif row.proc.poll() is not None:
                raise AssertionError(f"{key} exited {row.proc.returncode}: {row.proc.stderr.read().decode()}")
        time.sleep(0.1)
    assert not pending, f"hostile processes not running: {sorted(pending)}"
    time.sleep(1)  # the large perf map is complete (the copy ends before the burner loops)


@pytest.fixture(scope="module")
def hostile_rows(bpf_ready, hostile_user, user_bin, secret, zeros_xz) -> dict[str, Row]:
    rows = _start_rows(hostile_user, user_bin, secret, zeros_xz)
    try:
        _wait_running(rows, hostile_user.uid)
        yield rows
    finally:
        for row in rows.values():
            kill_group(row.proc)
        for row in rows.values():
            if row.proc.stderr:
                row.proc.stderr.close()


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
    return Recorded(run, out, json.loads(report_run.stdout), report_run, table_run, record_payload(out))


def test_record_completes_in_time_and_bounded(recorded):
    """Exit 0 within the duration plus a few drain periods after attaching, under 1 GB, no internal error,
    and every BPF program it loaded is gone."""
    run = recorded.run
    run.assert_sane(max_wall_s=run.attached_s + RECORD_SECONDS + 3 * DRAIN_S)
    assert run.prog_ids and not run.prog_ids & loaded_prog_ids()
    meta = recorded.report["meta"]
    assert meta["system_wide"] and meta["total_samples"] > 0
    assert meta["duration_s"] <= RECORD_SECONDS + 2 * DRAIN_S


def test_record_nothing_secret_anywhere(recorded, secret):
    secret.assert_absent(recorded.run.stderr, where="record's stderr")
    secret.assert_absent(recorded.payload, where="the record file")
    secret.assert_absent(recorded.report_run.stdout, recorded.table_run.stdout, where="report")


def test_record_warnings_are_one_line_each(recorded):
    for warning in recorded.report["meta"]["warnings"]:
        assert "\n" not in warning and "\x1b" not in warning and len(warning) < 400, warning


def test_report_table_has_no_terminal_escapes(recorded):
    table = recorded.table_run
    assert table.returncode == 0, table.describe()
    assert "hescape" in table.stdout  # the escape row was sampled and shown
    assert not any(ch in table.stdout for ch in "\x1b\x07\x9b"), "raw control characters reach the terminal"


@pytest.mark.parametrize("key", ROW_KEYS)
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
    return Served(run, scrapes, concurrent, drains, last.body.decode(errors="replace"))


def test_serve_kept_answering_and_draining(served):
    """Every scrape answered within two drain periods, and the drains went on (none stalled)."""
    assert all(s.status == 200 for s in served.scrapes)
    slowest = max(s.seconds for s in served.scrapes)
    assert slowest <= 2 * DRAIN_S, f"a scrape took {slowest:.1f} s"
    assert served.drains[-1] - served.drains[0] >= SERVE_SECONDS / DRAIN_S - 3, served.drains


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


@pytest.mark.parametrize("key", ROW_KEYS)
def test_row_met_by_serve(served, hostile_rows, key):
    """The row's process shows up in /metrics: serve sampled it and survived it."""
    assert f'comm="{hostile_rows[key].comm}"' in served.last_body
