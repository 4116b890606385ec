"""Issue 40, item 1, against root's real `optrace serve` (BPF, the whole machine, its page of every process
sampled): an unprivileged user opens 256 sockets from each of 17 loopback addresses and 300 more from the
scraper's own address (127.0.0.1), each with the least receive buffer the kernel allows, each sending 20
pipelined `GET /metrics` and never reading (tests/serve/slowclients.py's ``pipeline`` mode, run as that
user); a socket serve closes is opened again 2-4 s later. Without and with basic auth (the attacker sends no
password). The page is at least the issue's ~90 KB by construction, whatever else the machine runs: serve
counts the calls of a copy of workloads/many (500 functions, each called once) under a path long enough
to make each of their series PAGE_LINE bytes (a fresh CI machine's own series made 81 KB). Prometheus (root, 127.0.0.1) scrapes on a new connection every 0.5 s, 100 times.

Targets: at least 99 % of the scrapes succeed with p99 at most 1 s, and the server's own account of what
its connections hold (optrace_http_*, as the scrapes saw it) stays within its bounds while the table is full.
serve and the scraper run first in line for the CPU (nice -20, an autogroup of their own: other people's
jobs on a shared machine are not serve's slowness); the attacker does not. serve's RSS is printed, not
held to a bound here: on this shared machine it swings by 90 MB with no client at all (133 to 221 MB within
two minutes: processes come and go, their symbol tables with them); tests/serve/test_slow_readers.py holds
serve's HTTP side, without the BPF side, to the issue's 100 MB during and 80 MB after. On main before the
fix: 1 of 91 scrapes, serve 87 -> 575 MB, 212 MB after (the issue's figures)."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import pytest

from hostilekit import OPTRACE, HostileUser, wait_for_line
from optrace.frontend.serve.httpserver import ANSWER_BYTES, MAX_CONNECTIONS, REQUEST_BYTES
from serve.servekit import p99
from serve.test_slow_readers import (ATTACKERS, P99_TARGET_S, PASSWORD, SCRAPE_EVERY_S, SCRAPE_TIMEOUT_S,
                                     SCRAPES, SUCCESS_TARGET, RssWatch, rss_mb)
from support import bpf_prog_ids, first_in_line, still_loaded

pytestmark = [pytest.mark.bpf, pytest.mark.slow]
SERVE_TESTS = Path(__file__).resolve().parent.parent / "serve"
PAGE_BYTES = 90_000  # the issue's ~90 KB page
CALL_LINE = 'optrace_uprobe_calls_total{{binary="{}",symbol="fn_000",comm="{}"}} 1\n'
PAGE_LINE = 190  # bytes of each of the 500 call series: 95 KB of them


def page_program(tmp: Path, workloads: Path) -> Path:
    """A copy of workloads/many whose path makes each of its 500 call series PAGE_LINE bytes long."""
    prefix = f"{tmp}/page-of-issue-40-"  # its comm: the name's first 15 characters
    program = Path(prefix + "x" * (PAGE_LINE - len(CALL_LINE.format("", "")) - 15 - len(prefix)))
    shutil.copy2(workloads / "many", program)
    assert len(CALL_LINE.format(program, program.name[:15])) == PAGE_LINE
    return program


def start_serve(tmp: Path, auth: bool, program: Path) -> tuple[subprocess.Popen, str, Path]:
    args = [str(OPTRACE), "serve", "--listen", "127.0.0.1:0", "--uprobe", f"{program}:fn_*"]
    if auth:
        config = tmp / "web.yml"
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        config.chmod(0o600)
        args += ["--web-config", str(config)]
    err = tmp / "serve.err"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                preexec_fn=first_in_line)
    url = wait_for_line(err, r"serving (\S+)", proc, timeout=120).group(1)
    return proc, url, err


def page_size(url: str) -> int:
    return len(subprocess.run(["curl", "-s", "-u", f"prometheus:{PASSWORD}", url], capture_output=True).stdout)


def attacker(user: HostileUser, script: Path, port: str, count: int, sources: int, origin: str | None,
             seconds: float) -> subprocess.Popen:
    argv = user.argv("/usr/bin/python3", script, port, count, "pipeline", sources, seconds, *([origin] if origin else []))
    return subprocess.Popen(argv, env=user.env(), cwd=user.home, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def attacker_report(each: subprocess.Popen) -> dict:
    """The attacker's last line (its counts); a failure that says which attacker ended how."""
    out = each.communicate("stop\n", timeout=60)[0].strip().splitlines()
    assert out, f"attacker {each.args[-6:]} printed nothing, exit {each.returncode} (its stderr is above)"
    return json.loads(out[-1])


@pytest.mark.parametrize("auth", [False, True], ids=["open", "basic-auth"])
def test_root_serve_beside_pipelined_slow_readers(bpf_ready, hostile_user: HostileUser, workloads: Path, tmp_path: Path,
                                                  auth: bool):
    script = hostile_user.home / "slowclients.py"
    shutil.copy(SERVE_TESTS / "slowclients.py", script)
    script.chmod(0o644)
    seconds = 60 + SCRAPES * (SCRAPE_EVERY_S + SCRAPE_TIMEOUT_S)
    program = page_program(tmp_path, workloads)
    serve, url, err = start_serve(tmp_path, auth, program)
    programs: set[int] = set()
    try:
        port = url.split(":")[2].split("/")[0]
        subprocess.run([program, "1"], check=True, capture_output=True)  # each function called once
        time.sleep(10)  # its first drains: the page has the machine's series, its caches their first files
        assert page_size(url) > PAGE_BYTES, "the page is smaller than the issue's"
        programs = bpf_prog_ids(serve.pid)
        before = rss_mb(serve.pid)
        attackers = [attacker(hostile_user, script, port, count, sources, origin, seconds)
                     for count, sources, origin in ATTACKERS]
        try:
            with RssWatch(serve.pid) as watch:
                for each in attackers:
                    assert each.stdout.readline() == "ready\n", "the attackers did not get connected"
                scraper = subprocess.run([sys.executable, str(SERVE_TESTS / "servekit.py"), "scrape", url,
                                          str(SCRAPES), str(SCRAPE_EVERY_S), str(SCRAPE_TIMEOUT_S),
                                          f"prometheus:{PASSWORD}" if auth else ""],
                                         capture_output=True, text=True, timeout=seconds)
        finally:
            reports = [attacker_report(each) for each in attackers]
        page = page_size(url)
        after = rss_mb(serve.pid)
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60)
    scrapes = json.loads(scraper.stdout)
    times, failures = scrapes["times"], scrapes["failures"]
    ordered = sorted(times)
    slowest = p99(times)
    print(f"\n{'auth' if auth else 'open'}: {SCRAPES - len(failures)} of {SCRAPES} scrapes, median "
          f"{ordered[len(ordered) // 2]:.3f} s, p99 {slowest:.3f} s, max {ordered[-1]:.3f} s; page {page // 1024} KB; "
          f"serve RSS {before:.0f} MB before, {watch.peak_mb:.0f} MB peak, {after:.0f} MB at the end; "
          f"attackers: {reports}; failures: {failures[:5]}")
    assert code == 0, err.read_text()[-2000:]
    assert "Traceback" not in err.read_text()
    assert not still_loaded(programs)
    assert page > PAGE_BYTES, "the page is smaller than the issue's"
    assert sum(report["opened"] for report in reports) >= 2 * sum(count for count, _, _ in ATTACKERS)
    assert SCRAPES - len(failures) >= SUCCESS_TARGET * SCRAPES, failures[:5]
    assert slowest <= P99_TARGET_S, ordered[-5:]
    peaks = scrapes["peaks"]
    assert peaks['optrace_http_connections_cut_total{reason="gave_way"}'] > 0  # the table was full
    assert peaks["optrace_http_connections"] <= peaks["optrace_http_connections_max"] == MAX_CONNECTIONS
    assert peaks['optrace_http_held_bytes{kind="request"}'] <= REQUEST_BYTES
    assert peaks['optrace_http_held_bytes{kind="answer"}'] <= ANSWER_BYTES
