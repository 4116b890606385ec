"""Opening JIT symbol files that anybody may have written (perf maps and jitdumps live in /tmp).

optrace runs as root, so a file planted at ``/tmp/perf-PID.map`` must not make it read (and print) a file
the planter could not read. A file is used only if, on the descriptor actually opened (no check-then-open
race): the last path component is not a symlink (O_NOFOLLOW), it is a regular file (so no FIFO can block
us: O_NONBLOCK), it has one hard link, it is owned by root or by the uid the process runs as, and it is
under the size limit. A refused file is never read: only the reason is reported.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

DEFAULT_MAX_SIZE = 256 << 20


class RefusedFile(Exception):
    """The file exists but must not be used. ``reason`` is a short key, ``str()`` a sentence."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class TrustPolicy:
    """What a file must satisfy. ``owners`` None means any owner (a path the user named explicitly)."""

    owners: frozenset[int] | None
    max_size: int = DEFAULT_MAX_SIZE
    follow_symlinks: bool = False


def owners_for(process_uid: int | None) -> frozenset[int]:
    """Root, plus the uid of the process the file describes (when known)."""
    return frozenset({0} if process_uid is None else {0, process_uid})


def open_trusted(path: str, policy: TrustPolicy, dir_fd: int | None = None) -> int | None:
    """Open ``path`` read-only for a trusted read, or return None when it does not exist.

    Raises :class:`RefusedFile` when it exists but fails the policy. The caller owns the returned fd.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not policy.follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedFile(path, "symlink", "is a symbolic link (not followed)") from None
        raise RefusedFile(path, "unreadable", f"cannot open: {exc.strerror}") from None
    try:
        check_descriptor(path, os.fstat(fd), policy)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_descriptor(path: str, st: os.stat_result, policy: TrustPolicy) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise RefusedFile(path, "not_regular", "is not a regular file")
    if st.st_nlink != 1 and not policy.follow_symlinks:
        raise RefusedFile(path, "hard_links", f"has {st.st_nlink} hard links (expected 1)")
    if policy.owners is not None and st.st_uid not in policy.owners:
        wanted = " or ".join(f"uid {u}" if u else "root" for u in sorted(policy.owners))
        raise RefusedFile(path, "owner", f"is owned by uid {st.st_uid}, not {wanted}")
    if st.st_size > policy.max_size:
        raise RefusedFile(path, "too_large", f"is {st.st_size} bytes, over the {policy.max_size}-byte limit")
