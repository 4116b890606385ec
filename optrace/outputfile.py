"""Writing an output file the user named (``-o``), the way ``record -o`` always has: never through a
planted symlink, never half-written.

The target's folder is opened without following another user's symlink on the way (:mod:`optrace.outputdir`);
in it, the data goes to a new temporary file (``O_CREAT|O_EXCL|O_NOFOLLOW``, so nothing that already exists
is opened), is flushed and synced, then renamed over the target, all relative to that folder's descriptor.
``rename`` replaces a symlink at the target instead of following it, so ``/tmp/report.txt -> /etc/shadow``
planted by another user is replaced, and the final name holds either the previous file or the complete new
one.

Who may read it: run as root, the file is 0600 (and the umask's): a record, an annotate listing, a JSON
or OTLP report of the whole machine holds other users' source lines, code and command lines (perf writes
perf.data 0600 too). Under sudo it belongs to the invoking user (SUDO_UID/SUDO_GID), who reads it without
root. Run as anyone else, the umask decides (0666 & ~umask), as for any file the user makes.

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
from typing import IO, TextIO

from optrace.errors import OptraceError
from optrace.fileaccess import printable
from optrace.outputdir import Target, invoking_uid, open_target


def write_atomically(path: str | os.PathLike[str], data: bytes, *, keep_previous: bool = False) -> None:
    """Write ``data`` to ``path`` atomically. With ``keep_previous`` an existing regular file stays
    reachable as ``<name>.old`` (perf's habit for perf.data). Raises OSError."""
    with atomic_output(path, "wb", keep_previous=keep_previous) as out:
        out.write(data)


@contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "w", *, keep_previous: bool = False,
                  encoding: str = "utf-8", errors: str = "backslashreplace") -> Iterator[IO]:
    """A stream whose content replaces ``path`` when the block ends without an exception (and is
    discarded otherwise). Raises OSError when the folder cannot be opened (or only through another user's
    symlink), or the file cannot be created or renamed."""
    target = open_target(path)
    try:
        if is_null_device(target):
            with _null_output(target, mode, encoding, errors) as out:
                yield out
            return
        check_target(target, os.fspath(path))
        with _replacing(target, mode, keep_previous, encoding, errors) as out:
            yield out
    finally:
        os.close(target.dir_fd)


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise OSError now for what :func:`atomic_output` would refuse at the end (a folder that cannot be
    opened, a device or a link into /proc at the name), so a long recording is not made for nothing. The
    write still checks again: the name may change meanwhile."""
    target = open_target(path)
    try:
        if not is_null_device(target):
            check_target(target, os.fspath(path))
    finally:
        os.close(target.dir_fd)


@contextmanager
def _replacing(target: Target, mode: str, keep_previous: bool, encoding: str, errors: str) -> Iterator[IO]:
    fd, tmp_name = _create_temporary(target)
    try:
        text = {} if "b" in mode else {"encoding": encoding, "errors": errors}
        with os.fdopen(fd, mode, **text) as out:
            yield out
            out.flush()
            os.fchmod(out.fileno(), output_mode())
            _give_to_sudo_user(out.fileno())
            os.fsync(out.fileno())
        if keep_previous:
            _keep_previous(target)
        os.replace(tmp_name, target.name, src_dir_fd=target.dir_fd, dst_dir_fd=target.dir_fd)
    except BaseException:
        _unlink_quietly(target.dir_fd, tmp_name)
        raise
    _fsync_dir(target.dir_fd)


TEMPORARY_TRIES = 100  # names tried before giving up (mkstemp's habit, with 2**32 names each time)


def _create_temporary(target: Target) -> tuple[int, str]:
    """A new file ``.<name>.<random>.tmp`` beside the target, open for writing, mode 0600."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(TEMPORARY_TRIES):
        name = f".{target.name}.{os.urandom(4).hex()}.tmp"
        try:
            return os.open(name, flags, 0o600, dir_fd=target.dir_fd), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", target.name)


def check_target(target: Target, shown: str) -> None:
    """Raise OSError when the target is, or leads to, something that is not a regular file: the rename would
    replace a device, FIFO or socket for everyone (as root, ``-o /dev/zero``), or when it is a link into
    /proc: ``-o /dev/stdout``, a symlink to ``/proc/self/fd/1``, leads to a regular file when stdout was
    redirected to one, and the rename replaced /dev/stdout for the whole machine. A new name or a symlink to
    a regular file is fine: it is replaced. ``shown`` is the path for messages.
    (The null device itself is written as it is: see :func:`is_null_device`.)"""
    try:
        itself = os.stat(target.name, dir_fd=target.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return  # a new name
    if stat.S_ISLNK(itself.st_mode) and os.readlink(target.name, dir_fd=target.dir_fd).startswith("/proc/"):
        raise OSError(errno.EEXIST, "a link into /proc, to a process's open file, is never replaced", shown)
    try:
        mode = os.stat(target.name, dir_fd=target.dir_fd).st_mode  # what a link leads to (only looked at)
    except OSError:
        return  # a dangling symlink: the rename makes a regular file
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EEXIST, "not a regular file (a device, FIFO or socket is never replaced)", shown)


NULL_DEVICE = os.makedev(1, 3)  # Linux's /dev/null: character device 1, 3


def is_null_device(target: Target) -> bool:
    """Whether the target itself (a link is not followed) is the null device."""
    try:
        info = os.stat(target.name, dir_fd=target.dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE


@contextmanager
def _null_output(target: Target, mode: str, encoding: str, errors: str) -> Iterator[IO]:
    """The null device, opened as it is written to by every tool, with the rules of any other open of a
    name someone else may swap: no link followed, no blocking (a FIFO put there fails), and what was opened
    checked to be the null device still."""
    fd = os.open(target.name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                 dir_fd=target.dir_fd)
    info = os.fstat(fd)
    if not (stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE):
        os.close(fd)
        raise OSError(errno.EEXIST, "not a regular file (a device, FIFO or socket is never replaced)", target.name)
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


def output_mode() -> int:
    """The mode of a new output file: 0600 as root (it may hold every user's source lines and command
    lines), else the umask's 0666."""
    return (0o600 if os.geteuid() == 0 else 0o666) & ~current_umask()


def _give_to_sudo_user(fd: int) -> None:
    """Under sudo the file goes to the invoking user (SUDO_UID/SUDO_GID), who can then read and move it."""
    uid, gid = invoking_uid(), os.environ.get("SUDO_GID", "")
    if uid != os.geteuid():
        os.fchown(fd, uid, int(gid) if gid.isdigit() else -1)


def _keep_previous(target: Target) -> None:
    """Make the current file (if a regular file) also reachable as <name>.old, without ever removing it
    from the final name: a hard link, so a crash before the rename leaves the old file in place."""
    try:
        if not stat.S_ISREG(os.stat(target.name, dir_fd=target.dir_fd, follow_symlinks=False).st_mode):
            return
    except FileNotFoundError:
        return
    old = target.name + ".old"
    _unlink_quietly(target.dir_fd, old)
    try:
        os.link(target.name, old, src_dir_fd=target.dir_fd, dst_dir_fd=target.dir_fd, follow_symlinks=False)
    except OSError:
        pass  # a filesystem without hard links: the new file still replaces the old one atomically


def _fsync_dir(dir_fd: int) -> None:
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)  # O_PATH cannot be synced
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
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
