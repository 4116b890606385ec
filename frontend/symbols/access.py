"""How the symbolizer opens ELF files, and the one boundary around each file it reads.

Every binary, library and debug file goes through :mod:`optrace.fileaccess`:

- a mapped file is opened through ``/proc/PID/map_files`` (the very inode the process maps, even
  deleted or in another mount namespace); without CAP_SYS_ADMIN, through an ``O_PATH`` descriptor of
  ``/proc/PID/root`` (no symlink or mount of that namespace followed) and used only if it is the same
  inode;
- a path as the process mapped it (``/proc/PID/maps`` prints it canonical) is opened without following
  any symlink; a file only reachable through another mount namespace is kept open as a descriptor,
  read later through a duplicate (never through the ``/proc/self/fd/N`` magic link);
- a path a process in another mount namespace or root exec'd (a container's, :func:`in_other_namespace`)
  is that process's: its files are read through it, from its mappings, never by that path here, where it
  may name nothing or another file;
- only paths built from the system's own configuration (ld.so.cache, the default library folders, the
  standard-folder scan, the debug roots) and execve'd paths follow symlinks (see :class:`FileRef`).

:class:`FileProblems` is the boundary: whatever one file raises (refused, over a budget, malformed)
costs that file's names, as one counted warning line, never the caller.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from optrace.containment import contain
from optrace.fileaccess import (BoundedFile, BudgetExceeded, FilePolicy, RefusedFile, check_descriptor, open_file,
                                open_mapped, open_reader, printable, reader_for)
from optrace.frontend.symbols.elffile import ElfFormatError
from optrace.procfs import MapEntry

# ELF objects are read piecewise (headers, a few sections, each under its own budget), so the size cap
# only refuses absurd files; the time budget covers all reads of one load.
ELF_POLICY = FilePolicy(max_size=8 << 30, read_seconds=5.0)
# Debug files found by .gnu_debuglink are read whole for their CRC-32.
DEBUG_LINK_POLICY = FilePolicy(max_size=1 << 30, read_seconds=5.0)
MAX_MESSAGE = 300  # characters of an exception's text quoted in a warning

T = TypeVar("T")


@dataclass(frozen=True)
class FileRef:
    """An ELF file: ``name`` is its path as the process sees it (what frames show).

    It is read from ``fd`` when set (a descriptor the Machine keeps for a file only reachable through
    another mount namespace, or deleted), else from ``read_path``. ``follow_symlinks`` only for paths
    that come from the system's configuration or from execve (an exec'd path is often a symlink, e.g.
    /usr/bin/java via /etc/alternatives; whatever it leads to is still checked as a regular disk file,
    and is only used for frames carrying its own build-id).
    """

    name: str
    read_path: str | None
    from_maps: bool = False  # seen in /proc/PID/maps (its name is what the process mapped)
    follow_symlinks: bool = False
    fd: int | None = None


def open_ref(ref: FileRef, policy: FilePolicy = ELF_POLICY) -> BoundedFile:
    """A bounded reader of ``ref``. Raises RefusedFile, FileNotFoundError or another OSError."""
    if ref.fd is not None:
        fd = os.dup(ref.fd)
        try:
            check_descriptor(fd, ref.name, policy)
        except BaseException:
            os.close(fd)
            raise
        return reader_for(fd, policy, ref.name)
    if ref.read_path is None:
        raise FileNotFoundError(2, "no longer reachable (its process is gone)", ref.name)
    reader = open_reader(ref.read_path, replace(policy, follow_symlinks=ref.follow_symlinks), shown=ref.name)
    if reader is None:
        raise FileNotFoundError(2, os.strerror(2), ref.name)
    return reader


def open_mapped_file(pid: int, entry: MapEntry, policy: FilePolicy = ELF_POLICY) -> int | None:
    """A descriptor of the file ``pid`` maps at ``entry``; None when the process or mapping is gone."""
    try:
        return open_mapped(pid, entry.start, entry.end, policy, shown=entry.file_path)
    except RefusedFile as refused:
        if refused.reason != "unreadable":  # map_files needs CAP_SYS_ADMIN: else try the root
            raise
    return _open_in_root(pid, entry, policy)


def in_other_namespace(pid: int) -> bool | None:
    """Whether the process sees another file tree than optrace (another mount namespace, or another root:
    a container, ``unshare --mount --root``); None when it is gone. Two stats, no open."""
    try:
        return _file_tree(str(pid)) != _file_tree("self")
    except OSError:  # gone (ENOENT, ESRCH)
        return None


def _file_tree(pid: str) -> tuple[int, int, int]:
    mounts, root = os.stat(f"/proc/{pid}/ns/mnt"), os.stat(f"/proc/{pid}/root")
    return mounts.st_ino, root.st_dev, root.st_ino


def _open_in_root(pid: int, entry: MapEntry, policy: FilePolicy) -> int | None:
    """The path inside the process's root, used only if it is still the mapped inode."""
    try:
        root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        fd = open_file(entry.file_path, policy, root_fd=root_fd, shown=entry.file_path)
    finally:
        os.close(root_fd)
    if fd is not None and not _is_mapped_inode(fd, entry):
        os.close(fd)
        return None
    return fd


def _is_mapped_inode(fd: int, entry: MapEntry) -> bool:
    info = os.fstat(fd)
    major, minor = (int(part, 16) for part in entry.dev.split(":"))
    return (info.st_ino, os.major(info.st_dev), os.minor(info.st_dev)) == (entry.inode, major, minor)


class FileProblems:
    """Counts and words the problems of single files. ``stats`` gets ``bad_files`` and
    ``bad_files_<kind>`` (refused, budget, unreadable, malformed), for the record and serve's metrics."""

    def __init__(self, warn: Callable[[str], None], stats: dict[str, int]) -> None:
        self._warn = warn
        self._stats = stats

    def contained(self, shown: str, consequence: str, read: Callable[[], T]) -> T | None:
        """``read()``, or None (and one counted warning) when it raises anything but a BaseException: the
        per-file boundary, a bad file costs only its names."""
        return contain(read, lambda err: self.report(shown, err, consequence))

    def report(self, shown: str, err: Exception, consequence: str) -> None:
        kind = problem_kind(err)
        for key in ("bad_files", f"bad_files_{kind}"):
            self._stats[key] = self._stats.get(key, 0) + 1
        self._warn(printable(f"{describe(shown, err)}; {consequence}"))

    def warn(self, message: str) -> None:
        self._warn(printable(message))


def problem_kind(err: Exception) -> str:
    if isinstance(err, RefusedFile):
        return "refused"
    if isinstance(err, BudgetExceeded):
        return "budget"
    if isinstance(err, OSError):
        return "unreadable"
    return "malformed"


def describe(shown: str, err: Exception) -> str:
    """One line naming the file and what was wrong, without file content beyond a short error text."""
    if isinstance(err, RefusedFile):  # names the refused file itself (a debug file, a library)
        if err.reason == "unreadable":
            return f"cannot read {err.path}: {err.detail.removeprefix('cannot open: ')}"
        return f"refused {err.path}: {err.detail}"
    if isinstance(err, BudgetExceeded):
        return f"{shown}: {err.strerror}"
    if isinstance(err, OSError):
        return f"cannot read {shown}: {err.strerror or err}"
    if isinstance(err, ElfFormatError):
        return f"{shown}: not a valid ELF file ({str(err)[:MAX_MESSAGE]})"
    return f"{shown}: malformed ({type(err).__name__}: {str(err)[:MAX_MESSAGE]})"
