"""The folder an output file (``-o``) goes into, opened one component at a time, never through another
user's symbolic link.

``rename`` replaces a symlink planted at the output's own name instead of following it
(:mod:`optrace.outputfile`), but the kernel resolves every component before that name: with /tmp/evil another
user's link to /etc, root's ``-o /tmp/evil/out.data`` replaced /etc/out.data (a root-only 0600 file became the
sudo user's 0644 output). So the folder is opened from ``/`` (or the working directory) one component at a
time, each an ``O_PATH|O_NOFOLLOW`` descriptor opened relative to the one before, and the output is created,
renamed and synced relative to the last one (``dir_fd``): the folder that was checked is the one written
into, whatever is renamed or swapped on the way meanwhile.

A component that is a symbolic link is followed by reading it (at most :data:`MAX_LINKS` in all, the kernel's
own bound) only when the link belongs to root or to the invoking user (``SUDO_UID`` under sudo, else the
effective uid): system links (``/var/run -> /run``, ``/lib -> usr/lib``) and the user's own keep working.
That is ``fs.protected_symlinks``' rule with the invoking user as the follower, for every component, and
without the kernel's two exceptions (any link in a folder that is not sticky and world-writable, and a link
of the folder's owner): those exist because the kernel guards against races in shared folders only, and
leaves a path through someone's own folder to that someone. Here root writes, and a link of whoever owns a
folder on the way (their home as well as /tmp) would send root's file anywhere on the machine.

The same walk opens the folders optrace keeps files in between runs (optrace/cachedir.py: its compiled
programs, unwind tables, kernel symbols), making missing ones on the way, and there also refuses a folder
on the way that another user owns or may write (unless it is sticky, as /tmp): whoever may rename what lies
in a folder can swap root's private folder for another between two runs.
"""
from __future__ import annotations

import errno
import os
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from optrace.fileaccess import printable

MAX_LINKS = 40  # the kernel's MAXSYMLINKS: a path through more links is ELOOP
WALK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Target:
    """Where an output goes: an ``O_PATH`` descriptor of its folder (closed by the caller) and its name there."""

    dir_fd: int
    name: str


def invoking_uid() -> int:
    """The user optrace runs for: under sudo (root with SUDO_UID) the invoking user, else the effective uid."""
    euid = os.geteuid()
    sudo_uid = os.environ.get("SUDO_UID", "")
    return int(sudo_uid) if euid == 0 and sudo_uid.isdigit() else euid


def open_target(path: str | os.PathLike[str]) -> Target:
    """The folder of ``path`` opened as the module says, and the name in it. Raises OSError: the folder's
    errors (ENOENT, ENOTDIR, EACCES...), EACCES for a link that is not followed, ELOOP past MAX_LINKS, and
    EISDIR when the name itself is a folder's (``/``, ``.``, ``..``)."""
    if not os.fspath(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "")
    final = Path(path)
    if final.name in ("", ".", ".."):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    parts = list(final.parent.parts)
    start = parts.pop(0) if final.is_absolute() else "."  # "/" (or POSIX's "//")
    return Target(_walk(start, parts), final.name)


def open_folder(path: str | os.PathLike[str], create_mode: int) -> int:
    """An ``O_PATH`` descriptor of the folder ``path`` itself, walked as the module says, the folders missing
    on the way made (the last one with ``create_mode``, the others 0755), and every folder on the way one
    that only root or the invoking user may change (else PermissionError)."""
    final = Path(path)
    parts = list(final.parts)
    start = parts.pop(0) if final.is_absolute() else "."
    return _walk(start, parts, create_mode)


def _walk(start: str, parts: list[str], create_mode: int | None = None) -> int:
    """The descriptor of the folder ``parts`` lead to from ``start``, links followed as the module says;
    with ``create_mode``, missing folders made and every folder checked (:func:`open_folder`)."""
    fd = _open_start(start)
    walked = [] if start == "." else [start]  # for messages
    pending = deque(parts)
    links = 0
    try:
        if create_mode is not None:
            _check_private(fd, _shown(walked))
        while pending:
            part = pending.popleft()
            if part in ("", "."):
                continue
            if create_mode is not None:
                _make(fd, part, create_mode if not any(p not in ("", ".") for p in pending) else 0o755)
            found = _step(fd, part, walked)
            if isinstance(found, int):
                os.close(fd)
                fd, walked = found, _walked_into(walked, part)
                if create_mode is not None:
                    _check_private(fd, _shown(walked))
                continue
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), _shown(walked + [part]))
            if found.startswith("/"):
                os.close(fd)
                fd, walked = _open_start("/"), ["/"]
            pending.extendleft(reversed(found.split("/")))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make(dir_fd: int, part: str, mode: int) -> None:
    """The folder ``part`` in ``dir_fd``, made if nothing is there (what is there is the walk's to judge)."""
    if part == "..":
        return
    try:
        os.mkdir(part, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass


def _check_private(fd: int, shown: str) -> None:
    """Refuse a folder another user owns, or may write without the sticky bit's protection."""
    info = os.fstat(fd)
    if info.st_uid not in (0, os.geteuid(), invoking_uid()):
        raise PermissionError(errno.EACCES, f"{printable(shown)} belongs to uid {info.st_uid}", shown)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise PermissionError(errno.EACCES, f"{printable(shown)} may be written by other users "
                                            f"(mode {stat.S_IMODE(info.st_mode):04o}, not sticky)", shown)


def _open_start(start: str) -> int:
    return os.open(start, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _step(dir_fd: int, part: str, walked: list[str]) -> int | str:
    """One component: the descriptor of the folder it is, or the text of a link that may be followed."""
    fd = os.open(part, WALK_FLAGS, dir_fd=dir_fd)
    info = os.fstat(fd)  # of an open descriptor: cannot fail
    if stat.S_ISDIR(info.st_mode):
        return fd
    try:
        return _link_text(fd, info, _shown(walked + [part]))
    finally:
        os.close(fd)


def _link_text(fd: int, info: os.stat_result, shown: str) -> str:
    if not stat.S_ISLNK(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
    if info.st_uid not in (0, invoking_uid()):
        raise PermissionError(errno.EACCES, f"{printable(shown)} is a symbolic link of uid {info.st_uid}: only"
                                            f" root's and the invoking user's links are followed", shown)
    return os.readlink("", dir_fd=fd)  # the very link whose owner was checked, not its name again


def _walked_into(walked: list[str], part: str) -> list[str]:
    if part != "..":
        return walked + [part]
    if walked == ["/"]:
        return walked
    return walked[:-1] if walked and walked[-1] != ".." else walked + [part]


def _shown(parts: list[str]) -> str:
    return os.path.join(*parts) if parts else "."
