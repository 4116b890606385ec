"""Issue 8, first row: an unprivileged user's process in its own user + pid + mount namespace whose
/tmp/perf-1.map is a bind mount of a root-only file, or whose tmp/ is a symlink to a folder holding one.
Root's JitSymbols must refuse both (the namespace's mounts are not crossed, its symlinks not followed),
and no warning may hold any of the file's content or its line count."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from jithelpers import wait_for
from support import system_user
from optrace.jitmaps.jitsymbols import JitSymbols

USER = "optrace-jit-test"
SECRET_NAME = "ROOT_ONLY_SECRET_9931"
SECRET_LINES = 7

# The process's new root: a tmpfs with /usr bind-mounted (for `sleep`); `$1` is the user's folder, `$2` a
# setup step that makes root/tmp/perf-1.map point at the secret. The shell chroots and stays alive.
NAMESPACE_SCRIPT = """
set -e
root="$1/root"; mkdir -p "$root"; mount -t tmpfs none "$root"; mkdir "$root/usr"
mount --bind /usr "$root/usr"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$root/$d"; done
eval "$2"
echo ok
exec chroot "$root" sleep 60
"""
BIND_FILE = 'mkdir "$root/tmp"; touch "$root/tmp/perf-1.map"; mount --bind "$1/secret/perf-1.map" "$root/tmp/perf-1.map"'
SYMLINKED_TMP = 'mkdir "$root/real"; mount --bind "$1/secret" "$root/real"; ln -s real "$root/tmp"'


@pytest.fixture(scope="module")
def jit_user():
    """An unprivileged account for this module (created if missing and then removed)."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd")
    with system_user(USER) as entry:
        yield entry


@pytest.fixture
def user_dir(jit_user):
    """A folder the user owns, holding secret/perf-1.map: root's, mode 0600, in a folder anyone may enter."""
    base = Path(tempfile.mkdtemp(prefix="optrace-jit-ns-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    os.chown(base, jit_user.pw_uid, jit_user.pw_gid)
    secret_dir = base / "secret"
    secret_dir.mkdir(mode=0o755)
    secret = secret_dir / "perf-1.map"
    secret.write_text("".join(f"{0x1000 * (i + 1):x} 100 {SECRET_NAME}_{i}\n" for i in range(SECRET_LINES)))
    os.chmod(secret, 0o600)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def start_in_namespace(user, base: Path, setup: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
         "unshare", "-Urmpf", "--mount-proc", "sh", "-c", NAMESPACE_SCRIPT, "sh", str(base), setup],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != "ok":
        proc.kill()
        pytest.fail(f"namespace setup failed: {proc.stderr.read()}")
    inner = int(wait_for(lambda: open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split())[0])
    wait_for(lambda: os.readlink(f"/proc/{inner}/root") != "/")  # chroot done
    return proc, inner


@pytest.mark.parametrize("setup,reason,detail", [
    (BIND_FILE, "mount", "crosses a mount point"),
    (SYMLINKED_TMP, "symlink", "symbolic link"),
], ids=["bind-mounted-file", "symlinked-tmp"])
def test_root_only_file_behind_a_namespace_is_refused(jit_user, user_dir, setup, reason, detail):
    proc, inner = start_in_namespace(jit_user, user_dir, setup)
    try:
        # The namespace really shows the secret at its /tmp/perf-1.map (a plain open as root reads it).
        with open(f"/proc/{inner}/root/tmp/perf-1.map") as f:
            assert SECRET_NAME in f.read()
        jit = JitSymbols()
        jit.poll(inner, time.monotonic())
        found = [jit.lookup(inner, 0x1000 * (i + 1) + 1, time.monotonic()) for i in range(SECRET_LINES)]
        jit.finish(time.monotonic())
    finally:
        proc.kill()
        proc.wait()
    assert found == [None] * SECRET_LINES
    assert jit.stats[f"refused_{reason}"] == 1
    assert len(jit.warnings) == 1 and detail in jit.warnings[0], jit.warnings
    text = " ".join(jit.warnings)
    assert SECRET_NAME not in text and str(SECRET_LINES) not in text.replace(str(inner), "")
    assert jit.stats["perfmap_lines"] == 0


def test_own_file_in_own_namespace_is_used(jit_user, user_dir):
    """The same set-up with a map the user wrote itself: read, named after the process's root."""
    own = 'mkdir "$root/tmp"; echo "5000 40 users_own_fn" > "$root/tmp/perf-1.map"'
    proc, inner = start_in_namespace(jit_user, user_dir, own)
    try:
        jit = JitSymbols()
        jit.poll(inner, 1.0)
    finally:
        proc.kill()
        proc.wait()
    assert jit.lookup(inner, 0x5010, 1.0) == ("users_own_fn", f"/proc/{inner}/root/tmp/perf-1.map")
    assert jit.warnings == []
