"""Planted files at a root process's /tmp/perf-PID.map: refused with one warning, content never shown."""
from __future__ import annotations

import os
import time

import pytest

from jithelpers import NOBODY, needs_root, wait_for
from optrace.jitmaps.jitsymbols import JitSymbols
from optrace.jitmaps.procinfo import read_identity
from optrace.jitmaps.trust import RefusedFile, jit_file_policy, open_file

SECRET = "TOPSECRET_NAME_4711"


@pytest.fixture
def secret(tmp_path):
    """A root-only file that would name every address if it were ever read as a perf map."""
    path = tmp_path / "secret"
    path.write_text(f"0 7fffffffffff {SECRET}\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def sleeper(spawn):
    return spawn(["sleep", "30"])


def poll_and_lookup(pid):
    jit = JitSymbols()
    jit.poll(pid, time.monotonic())
    jit.finish(time.monotonic())
    return jit, jit.lookup(pid, 0x1234, time.monotonic())


def assert_refused(jit, found, reason):
    assert found is None
    assert jit.stats[f"refused_{reason}"] >= 1
    assert len([w for w in jit.warnings if "perf-" in w]) == 1
    assert not any(SECRET in w for w in jit.warnings)


def test_symlink_to_secret_is_refused(sleeper, secret):
    os.symlink(secret, f"/tmp/perf-{sleeper.pid}.map")
    jit, found = poll_and_lookup(sleeper.pid)
    assert_refused(jit, found, "symlink")
    assert "symbolic link" in jit.warnings[0]


def test_file_of_another_user_is_refused(sleeper):
    needs_root()
    path = f"/tmp/perf-{sleeper.pid}.map"
    with open(path, "w") as f:
        f.write(f"0 7fffffffffff {SECRET}\n")
    os.chown(path, NOBODY, NOBODY)
    jit, found = poll_and_lookup(sleeper.pid)
    assert_refused(jit, found, "owner")
    assert f"owned by uid {NOBODY}" in jit.warnings[0]


def test_hard_link_to_secret_is_refused(sleeper, secret):
    os.link(secret, f"/tmp/perf-{sleeper.pid}.map")
    jit, found = poll_and_lookup(sleeper.pid)
    assert_refused(jit, found, "hard_links")


def test_fifo_is_refused_without_blocking(sleeper):
    os.mkfifo(f"/tmp/perf-{sleeper.pid}.map")
    started = time.monotonic()
    jit, found = poll_and_lookup(sleeper.pid)
    assert time.monotonic() - started < 2
    assert_refused(jit, found, "not_regular")


def test_size_limit(sleeper):
    with open(f"/tmp/perf-{sleeper.pid}.map", "w") as f:
        f.write("1000 10 x\n" * 100)
    jit = JitSymbols(max_file_size=500)
    jit.poll(sleeper.pid, 1.0)
    assert jit.stats["refused_too_large"] == 1 and "500-byte limit" in jit.warnings[0]


def test_map_of_a_process_of_another_user(spawn):
    """Owned by the process's uid: used. Owned by a third uid: refused."""
    needs_root()
    proc = spawn(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "30"])
    time.sleep(0.2)
    path = f"/tmp/perf-{proc.pid}.map"
    with open(path, "w") as f:
        f.write("1000 100 nobody_func\n")
    os.chown(path, NOBODY, NOBODY)
    jit = JitSymbols()
    jit.poll(proc.pid, 1.0)
    assert jit.lookup(proc.pid, 0x1010, 1.0)[0] == "nobody_func"
    os.chown(path, 1234, 1234)
    jit2 = JitSymbols()
    jit2.poll(proc.pid, 1.0)
    assert jit2.lookup(proc.pid, 0x1010, 1.0) is None and jit2.stats["refused_owner"] == 1


def test_open_trusted_missing_file_is_not_an_error(tmp_path):
    assert open_file(str(tmp_path / "nope"), jit_file_policy(0)) is None
    with pytest.raises(RefusedFile):
        open_file(str(tmp_path), jit_file_policy(0))


def test_root_owned_map_of_a_users_process_is_refused(spawn):
    """Issue 8's owner rule: a JIT file belongs to the process's own euid; root-owned is trusted for root's
    processes only (before, root-owned passed for everyone's processes)."""
    needs_root()
    proc = spawn(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "30"])
    wait_for(lambda: read_identity(proc.pid) and read_identity(proc.pid).euid == NOBODY)
    path = f"/tmp/perf-{proc.pid}.map"
    with open(path, "w") as f:
        f.write(f"1000 100 {SECRET}\n")
    jit, found = poll_and_lookup(proc.pid)
    assert found is None and jit.lookup(proc.pid, 0x1010, 1.0) is None
    assert_refused(jit, found, "owner")
    assert f"owned by uid 0, not uid {NOBODY}" in jit.warnings[0]
