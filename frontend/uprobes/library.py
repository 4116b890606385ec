"""Find the object a SPEC names, the way the dynamic linker finds libraries.

``c`` becomes the libc in ld.so.cache (``ldconfig -p``), ``libm.so.6`` the cached libm; a name that is no
cached library is looked up as a program on PATH (``bash:readline``). A name with a ``/`` is a path.
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess

from optrace.fileaccess import printable
from optrace.errors import OptraceError

# The ld.so.cache flag of this machine's native libraries, as `ldconfig -p` prints it.
_NATIVE_FLAGS = {"x86_64": "x86-64", "aarch64": "AArch64"}


@functools.cache
def ld_cache() -> tuple[tuple[str, str, str], ...]:
    """(soname, flags, path) rows of ld.so.cache, native architecture first."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise OptraceError(f"cannot read the library cache with '{ldconfig} -p': {exc}") from exc
    rows = []
    for line in out.splitlines()[1:]:
        head, arrow, path = line.strip().partition(" => ")
        if not arrow or " (" not in head:
            continue
        soname, _, flags = head.partition(" (")
        rows.append((soname, flags.rstrip(")"), path))
    native = _NATIVE_FLAGS.get(platform.machine(), "")
    return tuple(sorted(rows, key=lambda row: native not in row[1]))


def _library_matches(name: str, soname: str) -> bool:
    if ".so" in name:
        return soname == name
    stem = name if name.startswith("lib") else f"lib{name}"
    return soname == f"{stem}.so" or soname.startswith(f"{stem}.so.")


def find_object(name: str) -> str:
    """Path of the file a SPEC's object part names (not yet checked to be ELF)."""
    if "/" in name:
        if not os.path.exists(name):
            raise OptraceError(f"no such file: {printable(name)}")
        return name
    for soname, _flags, path in ld_cache():
        if _library_matches(name, soname) and os.path.exists(path):
            return path
    program = shutil.which(name)
    if program:
        return program
    raise OptraceError(
        f"'{printable(name)}' is neither a library in the ld.so cache nor a program on PATH: give its full path"
    )
