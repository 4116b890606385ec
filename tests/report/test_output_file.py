"""`report -o FILE` writes like `record -o` (optrace.outputfile): a new file renamed over the name, so a
symlink planted there is replaced, not followed, and the name holds the old or the whole new report; the
folders on the way are never reached through another user's symlink (optrace.outputdir)."""
from __future__ import annotations

import os
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from optrace.frontend.runtimes.cpython import FRAME_KIND
from optrace.model import Frame, Record, RecordMeta, RuntimeSource, Sample
from optrace.recordfile import write_record
from support import OPTRACE, assert_one_line_error, run_as_nobody

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


@pytest.mark.skipif(not ROOT, reason="root's outputs")
@pytest.mark.parametrize("argv", [["report", "--format", "json"], ["report", "--format", "otlp"],
                                  ["report", "--format", "folded"], ["report", "--format", "pprof"]])
def test_roots_outputs_are_readable_only_by_root(optrace, record_file: Path, out_dir: Path, argv: list[str]) -> None:
    """Issue 40: every output of a record can hold other users' source lines or command lines: as root it is
    0600 whatever the umask lets through (it was 0644 with root's usual 022)."""
    out = out_dir / "out"
    old_umask = os.umask(0o022)
    try:
        optrace(*argv, "-i", str(record_file), "-o", str(out), check=True)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.stat().st_size > 0


def python_record(path: Path) -> Path:
    """A record holding a Python function's source lines (what annotate lists)."""
    source = RuntimeSource("handler", "/srv/app/handler.py", 1, ["def handler():", "    API_KEY = 'x'"], {2: 10}, 1)
    frames = [Frame("handler", source.file, FRAME_KIND, line=2, address=1)]
    write_record(Record(RecordMeta("0", "h", "k", 0.0, 1.0, 99, "cpu-clock"), frames, [Sample(1, "python3", (0,), 10)],
                        functions=[], sources=[source]), path)
    return path


@pytest.mark.skipif(not ROOT, reason="root's outputs")
@pytest.mark.parametrize("command", ["annotate", "diff"])
def test_roots_listings_are_readable_only_by_root(optrace, record_file: Path, tmp_path: Path, out_dir: Path,
                                                  command: str) -> None:
    """Issue 40: annotate's listing holds the function's source lines, diff's the records' names: 0600 as root."""
    out = out_dir / "out"
    argv = (["annotate", "-i", str(python_record(tmp_path / "py.data")), "handler"] if command == "annotate"
            else ["diff", str(record_file), str(record_file)])
    old_umask = os.umask(0o022)
    try:
        optrace(*argv, "-o", str(out), check=True)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.stat().st_size > 0
    assert command != "annotate" or "API_KEY" in out.read_text()


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


@pytest.fixture
def root_only_victim(tmp_path: Path) -> Path:
    """A root-only (0600) out.data in a folder of root's: what a planted folder link would have replaced."""
    folder = tmp_path / "etc"
    folder.mkdir()
    victim = folder / "out.data"
    victim.write_text("root:secret\n")
    victim.chmod(0o600)
    return victim


@pytest.fixture
def nobodys_folder_link(root_only_victim: Path) -> Iterator[Path]:
    """/tmp/<name>, made by user nobody: a symlink to the victim's folder (/tmp is sticky and world-writable,
    so the link stays nobody's)."""
    link = Path(f"/tmp/optrace-evil-{secrets.token_hex(4)}")
    made = run_as_nobody("ln", "-s", str(root_only_victim.parent), str(link))
    assert made.returncode == 0, made.stderr
    assert link.lstat().st_uid == 65534
    yield link
    link.unlink()


def assert_untouched(victim: Path) -> None:
    info = victim.stat()
    assert victim.read_text() == "root:secret\n"
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o600, 0, 0)
    assert [p.name for p in victim.parent.iterdir()] == ["out.data"]  # no temporary file left either


@pytest.mark.skipif(not ROOT, reason="a root-only victim and a link of another user need root")
@pytest.mark.parametrize("sudo", [False, True], ids=["root", "sudo"])
def test_report_into_another_users_folder_link_is_refused(optrace, record_file: Path, root_only_victim: Path,
                                                          nobodys_folder_link: Path, monkeypatch, sudo: bool) -> None:
    """-o /tmp/evil/out.data with /tmp/evil nobody's link to a root folder: replaced the root-only file with
    the report (0644, the sudo user's) before; now one line, and the folder is never written into. Under sudo
    the invoking user (here uid 1000) is not the link's owner either."""
    monkeypatch.delenv("SUDO_UID", raising=False)
    if sudo:
        monkeypatch.setenv("SUDO_UID", "1000")
        monkeypatch.setenv("SUDO_GID", "1000")
    out = nobodys_folder_link / "out.data"
    proc = optrace("report", "-i", str(record_file), "-o", str(out))
    one_line_error(proc, f"cannot write {out}: {nobodys_folder_link} is a symbolic link of uid 65534: only root's"
                         f" and the invoking user's links are followed")
    assert_untouched(root_only_victim)


@pytest.mark.skipif(not ROOT, reason="a root-only victim and a link of another user need root")
def test_a_link_deeper_in_the_path_is_refused_too(optrace, record_file: Path, root_only_victim: Path,
                                                  nobodys_folder_link: Path, tmp_path: Path) -> None:
    """The link reached through root's own links and a '..': every component is checked, not only the first."""
    (tmp_path / "mine").symlink_to("/tmp")
    out = tmp_path / "mine" / ".." / "tmp" / nobodys_folder_link.name / "." / "out.data"
    proc = optrace("report", "-i", str(record_file), "-o", str(out))
    one_line_error(proc, f"/tmp/{nobodys_folder_link.name} is a symbolic link of uid 65534")
    assert_untouched(root_only_victim)


@pytest.mark.skipif(not ROOT, reason="records as root")
def test_record_into_another_users_folder_link_is_refused(bpf_ready, root_only_victim: Path,
                                                          nobodys_folder_link: Path) -> None:
    out = nobodys_folder_link / "out.data"
    proc = subprocess.run([str(OPTRACE), "record", "-F", "99", "-o", str(out), "--", "sleep", "0.2"],
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, f"cannot write {out}: {nobodys_folder_link} is a symbolic link of uid 65534")
    assert_untouched(root_only_victim)


@pytest.mark.skipif(not ROOT, reason="records as root")
def test_record_refuses_its_output_before_it_records(bpf_ready, out_dir: Path) -> None:
    """-o at a device (as root: -o /dev/zero) is refused before the recording, not after it: the command
    given is never run."""
    device, ran = out_dir / "zero", out_dir / "ran"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    proc = subprocess.run([str(OPTRACE), "record", "-o", str(device), "--", "touch", str(ran)],
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, f"cannot write {device}: not a regular file")
    assert not ran.exists() and stat.S_ISCHR(device.lstat().st_mode)


def test_permitted_links_on_the_way_are_followed(optrace, record_file: Path, tmp_path: Path) -> None:
    """Root's links (/var/run -> /run, as Debian has it) and the user's own, relative or absolute, chained,
    with '..' after a link (the kernel's meaning: the link target's parent)."""
    assert os.readlink("/var/run") in ("/run", "../run")
    real = tmp_path / "real" / "deep"
    real.mkdir(parents=True)
    (tmp_path / "rel").symlink_to("real/deep")
    (tmp_path / "abs").symlink_to(tmp_path / "rel")
    for out, written in [(tmp_path / "abs" / "r.txt", real / "r.txt"),
                         (tmp_path / "abs" / ".." / "up.txt", real.parent / "up.txt")]:
        optrace("report", "-i", str(record_file), "-o", str(out), check=True)
        assert written.read_text().startswith("# optrace report")
    if ROOT:
        name = f"optrace-test-{secrets.token_hex(4)}.txt"
        try:
            optrace("report", "-i", str(record_file), "-o", f"/var/run/{name}", check=True)
            assert Path("/run", name).read_text().startswith("# optrace report")
        finally:
            Path("/run", name).unlink(missing_ok=True)


def test_a_loop_of_links_is_one_error(optrace, record_file: Path, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    one_line_error(optrace("report", "-i", str(record_file), "-o", str(tmp_path / "a" / "r.txt")),
                   "Too many levels of symbolic links")
