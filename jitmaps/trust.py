"""Which JIT symbol files to trust, and how to open them: a thin layer over :mod:`optrace.fileaccess`.

optrace runs as root, so a file planted at ``/tmp/perf-PID.map`` must not make it read (and print) a file
the planter could not read. The open itself follows the one rule of :mod:`optrace.fileaccess` (no symlink
in any component, non-blocking, a regular file on a disk file system, under the size limit); this module
adds what is particular to JIT files:

- the file must be owned by the effective uid of the process it describes (root-owned files are trusted
  for root's processes only), and have one hard link (a planted hard link to someone else's file);
- a process in another mount namespace has its file resolved inside that namespace from an ``O_PATH``
  descriptor of ``/proc/PID/root``, without following its symlinks or crossing its mounts, so a bind mount
  of a root-only file over its ``/tmp/perf-1.map`` (or a symlinked ``/tmp``) is refused, not read.

A refused file is never read: only the reason is reported.
"""
from __future__ import annotations

import os

from optrace.fileaccess import DEFAULT_MAX_SIZE, FilePolicy, RefusedFile, open_file

__all__ = ["DEFAULT_MAX_SIZE", "RefusedFile", "jit_file_policy", "named_file_policy", "open_file",
           "open_process_root", "owners_for"]


def owners_for(process_euid: int) -> frozenset[int]:
    """The uids a process's JIT file may belong to: the process's own effective uid, nobody else's."""
    return frozenset({process_euid})


def jit_file_policy(process_euid: int, max_size: int = DEFAULT_MAX_SIZE) -> FilePolicy:
    """A perf map or jitdump found on a process's behalf: its owner, one link, no symlinks."""
    return FilePolicy(owners=owners_for(process_euid), max_size=max_size, single_link=True)


def named_file_policy(max_size: int = DEFAULT_MAX_SIZE) -> FilePolicy:
    """A file the user named on the command line: any owner, symlinks followed, still regular and bounded."""
    return FilePolicy(owners=None, max_size=max_size, follow_symlinks=True)


def open_process_root(pid: int) -> int | None:
    """An ``O_PATH`` descriptor of the process's root directory (None when the process is gone)."""
    try:
        return os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None

