"""`report -o FILE` writes like `record -o` (optrace.outputfile): a new file renamed over the name, so a
symlink planted there is replaced, not followed, and the name holds the old or the whole new report."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from support import OPTRACE

ROOT = os.geteuid() == 0


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A folder of its own (the record file is in tmp_path): what is in it after a run is checked."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def one_line_error(proc, message: str) -> None:
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


@pytest.mark.skipif(not ROOT, reason="a root-only victim file needs root")
def test_planted_symlink_to_a_root_only_file(optrace, record_file: Path, out_dir: Path) -> None:
    victim = out_dir / "shadow"
    victim.write_text("root:secret\n")
    victim.chmod(0o600)
    before = victim.stat()
    out = out_dir / "report.txt"
    out.symlink_to(victim)
    proc = optrace("report", "-i", str(record_file), "-o", str(out), check=True)
    assert proc.stdout == "" and proc.stderr == ""
    assert victim.read_text() == "root:secret\n"
    after = victim.stat()
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (before.st_mode, before.st_size, before.st_mtime_ns)
    assert stat.S_ISREG(out.lstat().st_mode)
    assert out.read_text() == optrace("report", "-i", str(record_file), check=True).stdout
    assert sorted(p.name for p in out_dir.iterdir()) == ["report.txt", "shadow"]  # no temp file left


def test_replaces_an_existing_report_and_follows_the_umask(optrace, record_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.csv"
    out.write_text("old\n")
    old_umask = os.umask(0o077)
    try:
        optrace("report", "-i", str(record_file), "--format", "csv", "-o", str(out), check=True)
    finally:
        os.umask(old_umask)
    assert out.read_text().startswith("comm,pid,tid,dso,symbol,")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink to a fifo",
                                  pytest.param("device", marks=pytest.mark.skipif(not ROOT, reason="mknod"))])
def test_non_regular_targets_are_refused(optrace, record_file: Path, out_dir: Path, kind: str) -> None:
    """A FIFO (would block), a directory, or a name leading to a device or pipe (/dev/stdout, /dev/zero:
    a rename would replace it for the whole machine) is refused; nothing there changes."""
    fifo = out_dir / "fifo"
    os.mkfifo(fifo)
    target = {"fifo": fifo, "directory": out_dir / "dir", "symlink to a fifo": out_dir / "link",
              "device": out_dir / "null"}[kind]
    if kind == "directory":
        target.mkdir()
    elif kind == "device":
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # a /dev/zero of the test's own
    elif kind == "symlink to a fifo":
        target.symlink_to(fifo)
    proc = optrace("report", "-i", str(record_file), "-o", str(target), timeout=20)
    one_line_error(proc, f"cannot write {target}: ")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert target.is_symlink() == (kind == "symlink to a fifo")
    assert stat.S_ISCHR(target.lstat().st_mode) == (kind == "device")
    assert sorted(p.name for p in out_dir.iterdir()) == sorted({"fifo", target.name})


def test_unwritable_directory_leaves_the_old_file(optrace, record_file: Path, tmp_path: Path) -> None:
    one_line_error(optrace("report", "-i", str(record_file), "-o", str(tmp_path / "nowhere" / "r.txt")),
                   "No such file or directory")


def test_the_null_device_is_written_to(optrace, record_file: Path, out_dir: Path) -> None:
    """-o /dev/null, as every tool takes it: the report is written into it (nothing replaced); a null device
    of the test's own stays one, and a link to it is refused like any link to a device."""
    proc = optrace("report", "-i", str(record_file), "-o", "/dev/null")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    if not ROOT:
        return
    null, link = out_dir / "null", out_dir / "link"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    link.symlink_to(null)
    optrace("report", "-i", str(record_file), "-f", "csv", "-o", str(null), check=True)
    assert stat.S_ISCHR(null.lstat().st_mode) and null.lstat().st_rdev == os.makedev(1, 3)
    one_line_error(optrace("report", "-i", str(record_file), "-o", str(link)), f"cannot write {link}: ")
    assert sorted(p.name for p in out_dir.iterdir()) == ["link", "null"]


def test_a_link_into_proc_is_not_replaced(optrace, record_file: Path, out_dir: Path) -> None:
    """What -o /dev/stdout is (a link to /proc/self/fd/1): with stdout redirected to a file it led to a
    regular file, and the rename replaced the link (/dev/stdout, for the whole machine)."""
    link, redirected = out_dir / "stdout", out_dir / "redirected.txt"
    link.symlink_to("/proc/self/fd/1")
    with open(redirected, "w") as stdout:
        proc = subprocess.run([str(OPTRACE), "report", "-i", str(record_file), "-o", str(link)], stdout=stdout,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 1 and "a link into /proc" in proc.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1" and redirected.read_text() == ""
