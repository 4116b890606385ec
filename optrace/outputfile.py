"""Writing an output file the user named (``-o``), the way ``record -o`` always has: never through a
planted symlink, never half-written.

The data goes to a new temporary file beside the target (``mkstemp``: ``O_CREAT|O_EXCL``, so nothing that
already exists is opened), is flushed and synced, then renamed over the target. ``rename`` replaces a
symlink at the target instead of following it, so ``/tmp/report.txt -> /etc/shadow`` planted by another
user is replaced, and the final name holds either the previous file or the complete new one.

One exception, which every tool writes to: a name that is the null device itself (``/dev/null``, not a
link to it) is opened and written, without following a link, blocking or a rename.
"""
from __future__ import annotations

import errno
import io
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TextIO

from optrace.errors import OptraceError
from optrace.fileaccess import printable


def write_atomically(path: str | os.PathLike[str], data: bytes, *, keep_previous: bool = False) -> None:
    """Write ``data`` to ``path`` atomically. With ``keep_previous`` an existing regular file stays
    reachable as ``<name>.old`` (perf's habit for perf.data). Raises OSError."""
    with atomic_output(path, "wb", keep_previous=keep_previous) as out:
        out.write(data)


@contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "w", *, keep_previous: bool = False,
                  encoding: str = "utf-8", errors: str = "backslashreplace") -> Iterator[IO]:
    """A stream whose content replaces ``path`` when the block ends without an exception (and is
    discarded otherwise). Raises OSError when the file cannot be created or renamed."""
    import tempfile  # only writers need it; report's start-up stays lean

    if is_null_device(path):
        with _null_output(path, mode, encoding, errors) as out:
            yield out
        return
    check_target(path)
    final = Path(path)
    directory = final.parent if str(final.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{final.name}.", suffix=".tmp")
    try:
        text = {} if "b" in mode else {"encoding": encoding, "errors": errors}
        with os.fdopen(fd, mode, **text) as out:
            yield out
            out.flush()
            os.fchmod(out.fileno(), 0o666 & ~current_umask())
            _give_to_sudo_user(out.fileno())
            os.fsync(out.fileno())
        if keep_previous:
            _keep_previous(final)
        os.replace(tmp_name, final)
    except BaseException:
        _unlink_quietly(tmp_name)
        raise
    _fsync_dir(directory)


def check_target(path: str | os.PathLike[str]) -> None:
    """Raise OSError when ``path`` is, or leads to, something that is not a regular file: the rename would
    replace a device, FIFO or socket for everyone (as root, ``-o /dev/zero``), or when it is a link into
    /proc: ``-o /dev/stdout``, a symlink to ``/proc/self/fd/1``, leads to a regular file when stdout was
    redirected to one, and the rename replaced /dev/stdout for the whole machine. A new name or a symlink to
    a regular file is fine: it is replaced.
    (The null device itself is written as it is: see :func:`is_null_device`.)"""
    if os.path.islink(path) and os.readlink(path).startswith("/proc/"):
        raise OSError(errno.EEXIST, "a link into /proc, to a process's open file, is never replaced", os.fspath(path))
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # a new name, a dangling symlink: the rename makes a regular file
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    if not stat.S_ISREG(mode):
        raise OSError(errno.EEXIST, "not a regular file (a device, FIFO or socket is never replaced)",
                      os.fspath(path))


NULL_DEVICE = os.makedev(1, 3)  # Linux's /dev/null: character device 1, 3


def is_null_device(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` itself (a link is not followed) is the null device."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE


@contextmanager
def _null_output(path: str | os.PathLike[str], mode: str, encoding: str, errors: str) -> Iterator[IO]:
    """The null device, opened as it is written to by every tool, with the rules of any other open of a
    name someone else may swap: no link followed, no blocking (a FIFO put there fails), and what was opened
    checked to be the null device still."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not (stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE):
        os.close(fd)
        raise OSError(errno.EEXIST, "not a regular file (a device, FIFO or socket is never replaced)", os.fspath(path))
    text = {} if "b" in mode else {"encoding": encoding, "errors": errors}
    with os.fdopen(fd, mode, **text) as out:
        yield out


def current_umask() -> int:
    """The umask, read without os.umask()'s set-and-restore (which would race with other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _give_to_sudo_user(fd: int) -> None:
    """Under sudo the file goes to the invoking user (SUDO_UID/SUDO_GID), who can then read and move it."""
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    if os.geteuid() != 0 or not uid.isdigit():
        return
    os.fchown(fd, int(uid), int(gid) if gid.isdigit() else -1)


def _keep_previous(final: Path) -> None:
    """Make the current file (if a regular file) also reachable as <name>.old, without ever removing it
    from the final name: a hard link, so a crash before the rename leaves the old file in place."""
    try:
        if not stat.S_ISREG(os.lstat(final).st_mode):
            return
    except FileNotFoundError:
        return
    old = final.with_name(final.name + ".old")
    _unlink_quietly(old)
    try:
        os.link(final, old, follow_symlinks=False)
    except OSError:
        pass  # a filesystem without hard links: the new file still replaces the old one atomically


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(name: str | os.PathLike[str]) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


@contextmanager
def output_stream(output: str) -> Iterator[TextIO]:
    """``-o OUTPUT`` of report and count: ``-`` is stdout, else a file written atomically (above): a new
    file renamed over the name, so a symlink planted there is replaced, never followed, and an output
    that fails (a report past its output budget, a count stopped by an error) leaves the name as it was.
    Names a terminal cannot encode are written as backslash escapes, in both. A file that cannot be
    created or renamed is an OptraceError ("cannot write ..."); errors of the block pass unchanged."""
    if output == "-":
        stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="backslashreplace", newline="")
        try:
            yield stdout
        finally:
            stdout.detach()  # flushed, and sys.stdout's buffer stays open
        return
    opened = atomic_output(output, "w", encoding="utf-8", errors="backslashreplace")
    with _cannot_write(output):
        out = opened.__enter__()
    try:
        yield out
    except BaseException:
        opened.__exit__(*sys.exc_info())  # the new file is removed; the error goes on
        raise
    with _cannot_write(output):
        opened.__exit__(None, None, None)


@contextmanager
def _cannot_write(output: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise OptraceError(f"cannot write {printable(output)}: {exc.strerror or exc}") from None
