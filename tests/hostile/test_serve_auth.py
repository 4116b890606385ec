"""Issue 8's table, the /metrics row: an ordinary user scrapes root's serve, which requires basic auth
(``--web-config`` in the exporter-toolkit format, bcrypt hashes)."""
from __future__ import annotations

import signal

import bcrypt
import pytest

from hostilekit import Running, still_loaded, scrape, wait_for_line

pytestmark = [pytest.mark.bpf, pytest.mark.slow]
PASSWORD = "correct horse battery staple"

SCRAPE_AS_USER = """
import base64, sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1])
if len(sys.argv) > 2:
    request.add_header("Authorization", "Basic " + base64.b64encode(sys.argv[2].encode()).decode())
try:
    with urllib.request.urlopen(request, timeout=20) as response:
        print(response.status, len(response.read()))
except urllib.error.HTTPError as exc:
    print(exc.code, len(exc.read()))
"""


@pytest.fixture(scope="module")
def guarded(bpf_ready, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-auth")
    config = tmp / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    config.chmod(0o600)
    running = Running(["serve", "--listen", "127.0.0.1:0", "--web-config", str(config)], tmp)
    try:
        url = wait_for_line(running.err_path, r"serving (\S+)", running.proc).group(1)
        running.wait_attached()
        yield url
    finally:
        run = running.finish(timeout=15, stop_signal=signal.SIGTERM)
        assert run.returncode == 0, run.describe()
        run.assert_sane(max_wall_s=300)
        assert not still_loaded(run.prog_ids)


@pytest.mark.parametrize("credentials", [None, "prometheus:wrong", "nobody:" + PASSWORD])
def test_ordinary_user_is_refused(guarded, hostile_user, credentials):
    args = ["/usr/bin/python3", "-c", SCRAPE_AS_USER, guarded] + ([credentials] if credentials else [])
    status, size = hostile_user.run(*args).split()
    assert status == "401", f"an ordinary user got HTTP {status} ({size} bytes) from /metrics"
    assert int(size) < 1000


def test_scrape_with_credentials(guarded):
    done = scrape(guarded, auth=("prometheus", PASSWORD))
    assert done.status == 200 and b"optrace_drains_total" in done.body
