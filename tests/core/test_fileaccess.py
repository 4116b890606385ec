"""The one file-access rule (optrace.fileaccess): what it refuses, and that refusing never blocks."""
from __future__ import annotations

import lzma
import os
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from optrace.fileaccess import (BudgetExceeded, FilePolicy, RefusedFile, decompress_lzma, decompress_zlib,
                                open_file, open_mapped, open_reader, printable, read_file)


def refusal(path: str, policy: FilePolicy = FilePolicy(), **kw) -> str:
    with pytest.raises(RefusedFile) as caught:
        fd = open_file(path, policy, **kw)
        os.close(fd)
    assert "\n" not in str(caught.value)
    return caught.value.reason


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text("TOP-SECRET-MARKER\n")
    path.chmod(0o600)
    return path


def test_regular_file_reads_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 5000)
    assert read_file(str(path)) == b"x" * 5000
    assert read_file(str(tmp_path / "missing")) is None


def test_symlink_at_the_end_or_on_the_way_is_refused(tmp_path: Path, secret: Path) -> None:
    (tmp_path / "link").symlink_to(secret)
    (tmp_path / "dirlink").symlink_to(tmp_path)
    assert refusal(str(tmp_path / "link")) == "symlink"
    assert refusal(str(tmp_path / "dirlink" / "secret")) == "symlink"
    assert read_file(str(tmp_path / "link"), FilePolicy(follow_symlinks=True)) == b"TOP-SECRET-MARKER\n"


def test_magic_links_are_never_followed(secret: Path) -> None:
    fd = os.open(secret, os.O_RDONLY)
    try:
        assert refusal(f"/proc/self/fd/{fd}", FilePolicy(follow_symlinks=True)) == "symlink"
    finally:
        os.close(fd)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert refusal(str(fifo)) == "not_regular"
    assert time.monotonic() - started < 1


@pytest.mark.root  # as another user /proc/kmsg is refused earlier, by the kernel
@pytest.mark.parametrize("path", ["/proc/kmsg", "/proc/self/environ", "/sys/kernel/notes"])
def test_pseudo_file_systems_are_refused(path: str) -> None:
    assert refusal(path, FilePolicy(follow_symlinks=True)) in ("pseudo_fs", "symlink")


def test_devices_and_directories_are_refused(tmp_path: Path) -> None:
    assert refusal("/dev/zero") == "not_regular"
    assert refusal(str(tmp_path)) == "not_regular"


def test_owner_size_and_hard_link_rules(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"12345")
    assert refusal(str(path), FilePolicy(owners=frozenset({12345}))) == "owner"
    assert refusal(str(path), FilePolicy(max_size=4)) == "too_large"
    os.link(path, tmp_path / "g")
    assert refusal(str(path), FilePolicy(single_link=True)) == "hard_links"


def test_reads_stop_at_the_size_checked_at_open(tmp_path: Path) -> None:
    path = tmp_path / "grows"
    path.write_bytes(b"a" * 10)
    reader = open_reader(str(path))
    with open(path, "ab") as more:
        more.write(b"b" * 1000)
    with reader:
        assert reader.read() == b"a" * 10
        reader.seek(5)
        assert reader.read(100) == b"a" * 5


def test_reads_stop_at_the_time_budget(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * 10)
    with open_reader(str(path), FilePolicy(read_seconds=0.0)) as reader:
        time.sleep(0.01)
        with pytest.raises(BudgetExceeded):
            reader.read(1)


def test_decompression_is_bounded() -> None:
    bomb = lzma.compress(b"\0" * (64 << 20))
    with pytest.raises(BudgetExceeded):
        decompress_lzma(bomb, 1 << 20)
    assert decompress_lzma(lzma.compress(b"ok"), 2) == b"ok"
    with pytest.raises(BudgetExceeded):
        decompress_zlib(zlib.compress(b"\0" * (64 << 20)), 1 << 20)
    assert decompress_zlib(zlib.compress(b"ok"), 2) == b"ok"


@pytest.mark.root  # /proc/PID/map_files needs CAP_SYS_ADMIN
def test_map_files_give_the_mapped_inode() -> None:
    with open("/proc/self/maps") as maps:
        line = next(line for line in maps if "python" in line and "r-xp" in line)
    start, end = (int(x, 16) for x in line.split()[0].split("-"))
    fd = open_mapped(os.getpid(), start, end)
    try:
        assert os.read(fd, 4) == b"\x7fELF"
    finally:
        os.close(fd)


def test_printable_escapes_terminal_controls() -> None:
    assert printable("a\x1b]0;x\x07\x1b[2Jb\nc") == "a?]0;x??[2Jb?c"


@pytest.fixture
def namespace_with_bind_mount(tmp_path: Path, secret: Path):
    """A process in its own mount namespace whose tmp/perf-1.map is a bind mount of a root-only file,
    and whose tmp/linked is a symlink to that file: what an unprivileged user can build with unshare."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a mount namespace")
    shared = tmp_path / "ns"
    shared.mkdir()
    (shared / "perf-1.map").write_text("")
    script = (f"mount --bind {secret} {shared}/perf-1.map && ln -s {secret} {shared}/linked "
              f"&& echo ready && exec sleep 60")
    child = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    root_fd = os.open(f"/proc/{child.pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    yield root_fd, shared
    os.close(root_fd)
    child.kill()
    child.wait()


def test_inside_a_mount_namespace_no_mount_or_symlink_is_followed(namespace_with_bind_mount) -> None:
    root_fd, shared = namespace_with_bind_mount
    assert refusal(f"{shared}/perf-1.map", root_fd=root_fd) == "mount"
    assert refusal(f"{shared}/linked", root_fd=root_fd) == "symlink"
    with pytest.raises(RefusedFile) as caught:
        open_file(f"{shared}/perf-1.map", root_fd=root_fd)
    assert "TOP-SECRET" not in str(caught.value)
