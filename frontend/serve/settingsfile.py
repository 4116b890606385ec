"""serve's own settings files (``--config``, ``--web-config``): read as root's files, and refused when another
user could have written them or when they hold no settings, at start and at every SIGHUP (a refused reload
keeps the running settings).

These files decide who may scrape serve (TLS, basic auth) and what it probes, as root. Another user can
change one that is not owned by root (or serve's user), that has a group or other write bit, or whose path
passes through a folder they can write (not sticky, as /tmp is) or own: any of that is refused, as
OpenSSH's StrictModes refuses such an authorized_keys. A file with no settings at all (empty, only comments)
is refused too: a web config truncated by an editor or a failed copy read at SIGHUP as "no TLS, no users",
opening `/metrics` to everyone without a word.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from optrace.errors import OptraceError
from optrace.fileaccess import FilePolicy, RefusedFile, read_file

# Root's own files: symlinks are fine (the folders along the real path are checked).
SETTINGS_POLICY = FilePolicy(max_size=1 << 20, follow_symlinks=True, owners=frozenset({0, os.geteuid()}),
                             private=True)


def read_settings(path: str, what: str) -> bytes:
    """The bytes of the ``what`` ("web config") file at ``path``; OptraceError when it may not be used."""
    try:
        data = read_file(path, SETTINGS_POLICY)  # a FIFO or a device blocks nothing
    except (OSError, RefusedFile) as exc:
        detail = exc.detail if isinstance(exc, RefusedFile) else exc.strerror or exc
        raise OptraceError(f"cannot read {what} {path}: {detail}") from None
    if data is None:
        raise OptraceError(f"cannot read {what} {path}: it does not exist")
    problem = _unsafe_folder(Path(os.path.realpath(path)).parent)
    if problem:
        raise OptraceError(f"cannot read {what} {path}: {problem}: another user could replace it")
    return data


def require_settings(settings: object, path: str, what: str, instead: str) -> None:
    """``settings`` as parsed must hold at least one setting."""
    if settings is None or settings == {}:
        raise OptraceError(f"{what} {path} has no settings (empty, or only comments): {instead}")


def _unsafe_folder(folder: Path) -> str | None:
    """Why ``folder`` or one above it lets another user replace what is in it, or None."""
    for each in (folder, *folder.parents):
        st = os.stat(each)
        if st.st_uid not in SETTINGS_POLICY.owners:
            return f"the folder {each} is owned by uid {st.st_uid}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"the folder {each} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
