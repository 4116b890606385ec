"""Debian sid's python3.14 and python3.15 as a container runs them (tests/python, bench/bench_python.py).

They need sid's glibc, so they run from the sid root `make setup` makes (scripts/setup-sid-root.sh): in a
mount namespace of their own, with /proc mounted (the standard library's sampler reads /proc/PID/maps) and
the given host folders bound in at their own paths, then chroot. unshare and chroot exec into the
interpreter: the process started is the interpreter's (same pid). The mounts are private to the namespace
and go with it.
"""
from __future__ import annotations

import os
from pathlib import Path

SID_ROOT = Path(os.environ.get("OPTRACE_SID_ROOT", "/var/cache/optrace-test/sid"))
# $1 the root, $2 the folders to bind (colon-separated), then the command
_SCRIPT = ('root=$1; binds=$2; shift 2; mount -t proc proc "$root/proc" || exit 1; IFS=:; for dir in $binds; do '
           'mkdir -p "$root$dir" && mount --bind "$dir" "$root$dir" || exit 1; done; unset IFS; exec chroot "$root" "$@"')


def sid_python(minor: str) -> Path:
    """The file of sid's python3.X on this machine (it may not exist)."""
    return SID_ROOT / "usr" / "bin" / f"python{minor}"


def in_container(argv: list[str], binds: list[Path]) -> list[str]:
    """``argv`` (paths inside the sid root) run in a container of the sid root with ``binds`` bound in."""
    return ["unshare", "--mount", "--", "sh", "-c", _SCRIPT, "sh", str(SID_ROOT), ":".join(map(str, binds)), *argv]
