"""Fixtures for issue 8's acceptance tests: an unprivileged user, its programs, a root-only secret."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `import hostilekit`, `import hostilefiles`

from hostilekit import PROGRAMS, USER_NAME, HostileUser, Secret, make_secret, remove_perf_maps  # noqa: E402
from support import system_user  # noqa: E402

XZ_CACHE = Path("/var/tmp/optrace-hostile-cache")


def _user_pids(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid_line = next((line for line in text.splitlines() if line.startswith("Uid:")), "")
        if uid_line.split()[1:2] == [str(uid)]:
            pids.append(int(status.parent.name))
    return pids


def kill_user_processes(uid: int) -> None:
    """Every process still running as the test user (only this session's user: it was made for it)."""
    for pid in _user_pids(uid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def hostile_user() -> HostileUser:
    """The unprivileged account (created if missing, removed at the end if created here) and a folder
    it owns under /var/tmp (not /tmp: its namespace rows mount over /tmp)."""
    if os.geteuid() != 0:
        pytest.skip("creating a user needs root")
    with system_user(USER_NAME) as entry:
        yield from _hostile_user(entry)


def _hostile_user(entry: pwd.struct_passwd) -> Iterator[HostileUser]:
    home = Path(tempfile.mkdtemp(prefix="optrace-hostile-", dir="/var/tmp"))
    os.chmod(home, 0o755)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    user = HostileUser(USER_NAME, entry.pw_uid, entry.pw_gid, home)
    yield user
    kill_user_processes(user.uid)
    remove_perf_maps(user.uid)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def secret() -> Secret:
    base = Path(tempfile.mkdtemp(prefix="optrace-secret-base-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    yield make_secret(base)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def user_bin(hostile_user: HostileUser) -> Path:
    """The user's own builds of programs/*.c (compiled by the user, in its folder)."""
    src = hostile_user.home / "src"
    src.mkdir()
    for source in PROGRAMS.glob("*.c"):
        shutil.copy(source, src / source.name)
    for path in (src, *src.iterdir()):
        os.chown(path, hostile_user.uid, hostile_user.gid)
    build = ["gcc", "-O1", "-fno-omit-frame-pointer", "-g"]
    bin_dir, lib_dir = hostile_user.home / "bin", hostile_user.home / "reallib"
    hostile_user.run("mkdir", "-p", bin_dir, lib_dir)
    hostile_user.run(*build, "-static", "-o", bin_dir / "jitburn", src / "jitburn.c")
    hostile_user.run(*build, "-o", bin_dir / "burn", src / "burn.c")
    hostile_user.run(*build, "-shared", "-fPIC", "-o", lib_dir / "libhneed.so", src / "needlib.c")
    hostile_user.run(*build, "-DNEEDLIB", "-o", bin_dir / "hneedfifo", src / "burn.c",
                     f"-L{lib_dir}", "-lhneed", "-Wl,--enable-new-dtags,-rpath,$ORIGIN")
    hostile_user.run("mkfifo", bin_dir / "libhneed.so")
    return bin_dir


@pytest.fixture(scope="session")
def zeros_xz() -> Path:
    """xz of 4 GiB of zeros (about 610 KB; about 20 s to make, so cached across sessions)."""
    XZ_CACHE.mkdir(mode=0o755, exist_ok=True)
    path = XZ_CACHE / "zeros-4g.xz"
    if not path.exists():
        part = path.with_suffix(".part")
        with open(part, "wb") as out:
            head = subprocess.Popen(["head", "-c", "4G", "/dev/zero"], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-T1", "-0", "-c"], stdin=head.stdout, stdout=out, check=True)
            head.stdout.close()
            assert head.wait() == 0
        part.rename(path)
    return path
