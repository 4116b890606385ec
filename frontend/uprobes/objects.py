"""Which files a SPEC's object part names, in the order its symbol is looked for, each with why.

- A path (``/usr/bin/python3.11``, ``./demo``): that file.
- ``-p PID``: what the first such process really maps: a name that is its program (``python3.11``) gives
  the program, then the libraries it maps; a library name (``c``, ``libssl.so.3``) the mapped library of
  that name. So ``python3.11:PyList_Append`` counts where Debian's statically linked python runs it.
- Else a program on PATH (``python3.11``, ``bash``): the program, then its DT_NEEDED libraries found the
  way the dynamic linker finds them (:class:`~optrace.frontend.symbols.linker.Linker`): the symbol is
  counted in the first of them that defines it, not in a ``libpython3.11.so`` the program never loads.
- Else a library found like ``-lNAME`` in ld.so.cache (``c`` is libc.so.6, ``libm.so.6`` itself).
"""
from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass

from optrace.errors import OptraceError
from optrace.fileaccess import printable
from optrace.frontend.symbols.elffile import ELF_MAGIC
from optrace.frontend.symbols.linker import Linker, find_library, read_ld_so_cache
from optrace.frontend.uprobes.elf import open_binary
from optrace.procfs import read_maps


@dataclass(frozen=True)
class ObjectCandidate:
    path: str
    why: str  # "" for a path or a cached library; else how it was chosen (shown to the user)


@functools.cache
def _ld_so_cache() -> dict[str, list[str]]:
    return read_ld_so_cache()


def object_candidates(name: str, pids: tuple[int, ...] = ()) -> list[ObjectCandidate]:
    if "/" in name:
        if not os.path.exists(name):
            raise OptraceError(f"no such file: {printable(name)}")
        return [ObjectCandidate(name, "")]
    for pid in pids:
        mapped = _mapped_candidates(name, pid)
        if mapped:
            return mapped
    program = None if _is_library_name(name) else _elf_program(name)
    if program:
        return _program_candidates(name, program)
    library = find_library(name, _ld_so_cache())
    if library:
        return [ObjectCandidate(library, "")]
    raise OptraceError(
        f"'{printable(name)}' is neither a library in the ld.so cache nor a program on PATH: give its full path"
    )


def find_object(name: str) -> str:
    """The first file ``name`` names (see the module docstring), without the process's maps."""
    return object_candidates(name)[0].path


def _elf_program(name: str) -> str | None:
    """The first ELF program ``name`` on PATH; scripts are passed over (a pyenv shim or a wrapper script
    says nothing about the code that runs), the note tells the user which file was taken."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = shutil.which(name, path=directory or ".")
        if path and _is_elf(os.path.realpath(path)):
            return path
    return None


def _is_elf(path: str) -> bool:
    try:
        with open_binary(path) as binary:
            return binary.read(4) == ELF_MAGIC
    except (OptraceError, OSError):
        return False


def _is_library_name(name: str) -> bool:
    return name.startswith("lib") or ".so" in name


def _program_candidates(name: str, program: str) -> list[ObjectCandidate]:
    real = os.path.realpath(program)
    libraries, _ = Linker().needed_libraries(program)
    return [ObjectCandidate(real, f"{name} is the program {printable(real)}")] + [
        ObjectCandidate(ref.read_path, f"{printable(ref.read_path)} is a library {name} loads (DT_NEEDED)")
        for ref in libraries if ref.read_path]


def _mapped_candidates(name: str, pid: int) -> list[ObjectCandidate]:
    """The process's program and mapped libraries when ``name`` is its program; the mapped library
    ``name`` names otherwise; [] when the process maps nothing by that name."""
    maps = read_maps(pid)
    paths = list(dict.fromkeys(entry.path for entry in (maps.entries if maps is not None else ())
                               if entry.path.startswith("/") and os.path.exists(entry.path)))
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return []
    program = _elf_program(name)
    if os.path.basename(exe) == name or (program and os.path.realpath(program) == exe):
        return [ObjectCandidate(exe, f"{name} is the program of pid {pid}, {printable(exe)}")] + [
            ObjectCandidate(path, f"{printable(path)} is mapped by pid {pid}") for path in paths if path != exe]
    stem = name if _is_library_name(name) else f"lib{name}"
    for path in paths:
        base = os.path.basename(path)
        if base == name or base.startswith(f"{stem}.so") or base.startswith(f"{stem}-"):
            return [ObjectCandidate(path, f"{name} is {printable(path)}, as pid {pid} maps it")]
    return []
