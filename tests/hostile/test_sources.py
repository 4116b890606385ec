"""Issue 40, items 2 and 3, live: root's ``record -a`` keeps the hot Python functions' source lines for
``annotate``; an unprivileged user must get no file through it that the user could not open.

The attack (item 2): the hostile user's Python processes name, with ``code.replace(co_filename=...,
co_firstlineno=1)``, a 0644 file in a 0700 folder of root's (as root's home), a 0644 file in a 0700 folder
of a second user's, and that second file through a symlinked folder of the hostile user's. Root records
the machine for the hostile user (``sudo``: SUDO_UID, so the record is the user's), and the user runs
``annotate`` on it: none of those files' lines may be in the record or in what annotate shows, while the
user's own 0600 file in its 0700 folder is (the case that proves the capture works at all). Likewise machine
code: the user runs a program of root's it may only execute (mode 0711) and its own build of the same
source; annotate gets the code of its own, not root's.

Item 3: the second user runs its own 0600 program whose hot function holds an ``API_KEY`` line; root
records the machine (no sudo): the record keeps those lines (the second user's process may read its file),
so the hostile user must not be able to read root's record at all (it was 0644).
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostilekit import OPTRACE, PROGRAMS, HostileUser, Running, kill_group, wait_walked
from optrace.recordfile import read_record
from support import system_user

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

PYTHON = "/usr/bin/python3.11"  # Debian's: the walker names its frames
SECOND_USER = "optrace-second"
WINDOW_S = 5
STOP_S = 120
# The hostile user's program: ``burn`` under another file's name (and first line) when told one, else its own.
SPIN = '''import sys


def burn(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


target, name = sys.argv[1], sys.argv[2]
code = burn.__code__.replace(co_name=name, co_qualname=name)
if target != "-":
    code = code.replace(co_filename=target, co_firstlineno=1)
spin = type(burn)(code, globals())
while True:
    spin(100000)
'''
SECRET = 'def leaked():\n    TOKEN = "{marker}"\n    return TOKEN\n'
APP = '''def app_burn(n):
    API_KEY = "{marker}"
    total = 0
    for i in range(n):
        total += i * i
    return total, API_KEY


while True:
    app_burn(100000)
'''


@dataclass(frozen=True)
class Planted:
    root_secret: Path  # 0644 in root's 0700 folder
    second_secret: Path  # 0644 in the second user's 0700 folder
    through_link: Path  # the same, named through the hostile user's symlink to that folder
    own: Path  # the hostile user's own 0600 program, in its 0700 folder
    app: Path  # the second user's own 0600 program (its API_KEY line), in its 0700 folder
    markers: dict[str, str]  # what -> a marker found only in that file
    execute_only: Path  # root's build of programs/burn.c, mode 0711
    own_binary: Path  # the user's build of it

    def attacks(self) -> dict[str, Path]:
        """The hostile processes' function names -> the file each names."""
        return {"attack_root_home": self.root_secret, "attack_third_user": self.second_secret,
                "attack_symlinked_dir": self.through_link}


def folder(path: Path, uid: int, mode: int) -> Path:
    path.mkdir()
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


def planted_file(path: Path, text: str, uid: int, mode: int) -> Path:
    path.write_text(text)
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


@pytest.fixture(scope="module")
def second_user() -> Iterator[HostileUser]:
    """Another unprivileged account, its home a 0700 folder."""
    with system_user(SECOND_USER) as entry:
        home = Path(tempfile.mkdtemp(prefix="optrace-second-", dir="/var/tmp"))
        os.chown(home, entry.pw_uid, entry.pw_gid)
        os.chmod(home, 0o700)
        yield HostileUser(SECOND_USER, entry.pw_uid, entry.pw_gid, home)
        subprocess.run(["pkill", "-KILL", "-U", str(entry.pw_uid)], check=False)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def planted(hostile_user: HostileUser, second_user: HostileUser) -> Iterator[Planted]:
    base = Path(tempfile.mkdtemp(prefix="optrace-roothome-", dir="/var/tmp"))
    os.chmod(base, 0o700)  # as /root
    markers = {name: f"OPTRACE_SECRET_{name}_{secrets.token_hex(6)}" for name in ("root", "second", "app")}
    private = folder(hostile_user.home / f"private-{secrets.token_hex(3)}", hostile_user.uid, 0o700)
    link = hostile_user.home / f"peek-{secrets.token_hex(3)}"
    link.symlink_to(second_user.home)
    os.lchown(link, hostile_user.uid, hostile_user.gid)
    second_secret = planted_file(second_user.home / "open.py", SECRET.format(marker=markers["second"]),
                                 second_user.uid, 0o644)
    programs = Path(tempfile.mkdtemp(prefix="optrace-execonly-", dir="/var/tmp"))
    os.chmod(programs, 0o755)
    execute_only, own_binary = programs / "execonly", hostile_user.home / f"ownburn-{secrets.token_hex(3)}"
    subprocess.run(["gcc", "-O1", "-g", "-o", str(execute_only), str(PROGRAMS / "burn.c")], check=True)
    os.chmod(execute_only, 0o711)
    shutil.copy(PROGRAMS / "burn.c", private / "burn.c")
    os.chown(private / "burn.c", hostile_user.uid, hostile_user.gid)
    hostile_user.run("gcc", "-O1", "-g", "-o", own_binary, private / "burn.c")
    yield Planted(planted_file(base / "secret.py", SECRET.format(marker=markers["root"]), 0, 0o644),
                  second_secret, link / "open.py", planted_file(private / "spin.py", SPIN, hostile_user.uid, 0o600),
                  planted_file(second_user.home / "app.py", APP.format(marker=markers["app"]), second_user.uid, 0o600),
                  markers, execute_only, own_binary)
    shutil.rmtree(base)
    shutil.rmtree(programs)


@dataclass(frozen=True)
class Workload:
    pids: set[int]
    procs: list[subprocess.Popen]


@pytest.fixture(scope="module")
def workload(planted: Planted, hostile_user: HostileUser, second_user: HostileUser) -> Iterator[Workload]:
    """The hostile processes (three attacks and its own program) and the second user's program, spinning."""
    procs = [hostile_user.spawn(PYTHON, planted.own, str(path), name) for name, path in planted.attacks().items()]
    procs.append(hostile_user.spawn(PYTHON, planted.own, "-", "own_burn"))
    procs.append(second_user.spawn(PYTHON, planted.app))
    python_pids = {proc.pid for proc in procs}
    procs += [hostile_user.spawn(binary) for binary in (planted.execute_only, planted.own_binary)]
    try:
        yield Workload(python_pids, procs)
    finally:
        for proc in procs:
            kill_group(proc)


def record_machine(workload: Workload, out: Path, sudo: HostileUser | None) -> None:
    """root's ``record -a`` (run with sudo by ``sudo``, if given) for WINDOW_S once its walker expands every
    workload process."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SUDO_")}
    if sudo is not None:
        env.update(SUDO_UID=str(sudo.uid), SUDO_GID=str(sudo.gid), SUDO_USER=sudo.name)
    running = Running(["record", "-a", "-F", "199", "-o", str(out)], out.parent, env=env)
    try:
        running.wait_attached()
        wait_walked(running, workload.pids)
        for proc in workload.procs:
            assert proc.poll() is None, proc.stderr.read()
        time.sleep(WINDOW_S)
    finally:
        run = running.finish(timeout=STOP_S, stop_signal=signal.SIGINT)
    run.assert_sane(max_wall_s=WINDOW_S + 300)
    assert run.returncode == 0, run.describe()


@pytest.fixture(scope="module")
def outputs() -> Iterator[Path]:
    """Where root's records go: a folder of root's anyone may pass through."""
    base = Path(tempfile.mkdtemp(prefix="optrace-records-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base)


@pytest.fixture(scope="module")
def user_record(workload: Workload, hostile_user: HostileUser, outputs: Path) -> Path:
    """root's ``record -a`` for the hostile user (sudo)."""
    data = outputs / "for-user.data"
    record_machine(workload, data, sudo=hostile_user)
    return data


@pytest.fixture(scope="module")
def root_record(workload: Workload, outputs: Path) -> Path:
    """root's own ``record -a``."""
    data = outputs / "root.data"
    record_machine(workload, data, sudo=None)
    return data


def stored_sources(path: Path) -> dict[str, str]:
    """Function name -> its stored source lines, read by root."""
    return {source.symbol: "\n".join(source.text) for source in read_record(path).sources}


def test_sudo_record_keeps_no_file_the_user_could_not_open(user_record, planted, hostile_user):
    """Item 2: recorded for the hostile user (sudo), the record is theirs, and holds their own program's lines
    but none of the files their processes named and could not open: not in the record, not in annotate."""
    data = user_record
    stored = stored_sources(data)
    assert "own_burn" in stored and "total += i * i" in stored["own_burn"], \
        f"the user's own function was not kept: this run proves nothing ({sorted(stored)})"
    leaked = {name: stored[name] for name in planted.attacks() if name in stored}
    assert not leaked, f"files the user could not open were stored: {leaked}"
    for what in ("root", "second"):
        assert planted.markers[what] not in "\n".join(stored.values())
    listed = hostile_user.run(OPTRACE, "annotate", "-i", data)
    assert "own_burn" in listed, listed
    for name in planted.attacks():
        shown = subprocess.run(hostile_user.argv(OPTRACE, "annotate", "-i", data, name), capture_output=True,
                               text=True, env=hostile_user.env(), cwd=hostile_user.home, timeout=120)
        assert all(planted.markers[what] not in shown.stdout + shown.stderr for what in ("root", "second")), shown
        assert "Traceback" not in shown.stderr, shown.stderr
    own = hostile_user.run(OPTRACE, "annotate", "-i", data, "own_burn")
    assert "total += i * i" in own, own
    assert (data.stat().st_uid, data.stat().st_mode & 0o777) == (hostile_user.uid, 0o600)


def test_sudo_record_keeps_no_code_the_user_could_only_execute(user_record, planted, hostile_user):
    """The code of a program of root's that the user may run but not read (0711) is not kept for the user's
    record; the code of the user's own build of it is."""
    data = user_record
    code = {function.dso for function in read_record(data).functions if function.symbol == "hostile_burn"}
    assert str(planted.own_binary) in code, f"the user's own program's code was not kept: this run proves nothing ({code})"
    assert str(planted.execute_only) not in code
    listed = hostile_user.run(OPTRACE, "annotate", "-i", data, "--dso", planted.execute_only.name)
    assert "hostile_burn" not in listed, listed


def test_roots_record_is_not_readable_by_another_user(root_record, planted, hostile_user):
    """Item 3: root's record holds the second user's API_KEY line (its process may read its own file), and
    the hostile user can read neither the record nor anything of it."""
    data = root_record
    stored = stored_sources(data)
    assert planted.markers["app"] in stored.get("app_burn", ""), \
        f"the second user's function was not kept: this run proves nothing ({sorted(stored)})"
    assert (data.stat().st_uid, data.stat().st_mode & 0o777) == (0, 0o600)
    for argv in (["cat", data], [OPTRACE, "annotate", "-i", data, "app_burn"], [OPTRACE, "report", "-i", data]):
        tried = subprocess.run(hostile_user.argv(*argv), capture_output=True, text=True, env=hostile_user.env(),
                               cwd=hostile_user.home, timeout=120)
        assert tried.returncode != 0 and planted.markers["app"] not in tried.stdout, (argv, tried.stdout[-500:])
        assert "Traceback" not in tried.stderr, tried.stderr
