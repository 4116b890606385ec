"""Which shared libraries an executable loads, found the way the dynamic linker (ld.so(8)) finds them:
DT_RPATH (only without DT_RUNPATH) with $ORIGIN, DT_RUNPATH, /etc/ld.so.cache, then the default dirs.

Used for executables seen at exec time: their process may be gone before its maps can be read.
"""
from __future__ import annotations

import os
import platform
import struct
import subprocess
from collections import deque
from dataclasses import dataclass

from elftools.elf.enums import ENUM_E_MACHINE

from optrace.frontend.symbols.buildid import ELF_MAGIC
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.symbols.lru import LruCache

ELF_CLASS_BITS = {1: 32, 2: 64}  # EI_CLASS -> elfclass

MULTIARCH = {"EM_X86_64": "x86_64-linux-gnu", "EM_AARCH64": "aarch64-linux-gnu", "EM_386": "i386-linux-gnu"}


@dataclass(frozen=True)
class DynamicInfo:
    machine: str  # e_machine, e.g. "EM_X86_64"
    elfclass: int
    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()


def read_dynamic(path: str) -> DynamicInfo:
    """DT_NEEDED / DT_RPATH / DT_RUNPATH of ``path``. Raises OSError or ELFError."""
    with open(path, "rb") as stream:
        elf = ElfFile(stream)
        needed, rpath, runpath = [], [], []
        for section in elf.sections_of_type("SHT_DYNAMIC"):
            for tag in section.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(tag.needed)
                elif tag.entry.d_tag == "DT_RPATH":
                    rpath.extend(tag.rpath.split(":"))
                elif tag.entry.d_tag == "DT_RUNPATH":
                    runpath.extend(tag.runpath.split(":"))
        return DynamicInfo(elf["e_machine"], elf.elfclass, tuple(needed), tuple(rpath), tuple(runpath))


class Linker:
    """Resolves DT_NEEDED like ld.so, for one Symbolizer: the ld.so.cache listing is read once, and each
    object's dynamic section once per file version (libc is needed by every program: parsing the
    libraries again for each new executable made this ~10x slower, 20 ms instead of 2 ms a program)."""

    def __init__(self, max_cached: int = 4096) -> None:
        self._ld_cache: dict[str, list[str]] | None = None
        self._dynamic: LruCache[tuple[str, int, int, int], DynamicInfo] = LruCache(max_cached)

    def needed_libraries(self, executable: str) -> tuple[list[str], list[str]]:
        """All libraries ``executable`` loads, transitively, as paths; and a problem line for each
        library (or object) that could not be found or read."""
        found: list[str] = []
        problems: list[str] = []
        try:
            root = self.dynamic_info(executable)
        except Exception as err:  # noqa: BLE001 - any parse failure is just "no libraries known"
            return [], [f"cannot read the dynamic section of {executable}: {getattr(err, 'strerror', None) or err}"]
        exe_rpath = () if root.runpath else _expand(root.rpath, executable)
        queue = deque([(executable, root)])
        seen = {os.path.realpath(executable)}
        while queue:
            path, info = queue.popleft()
            for name in info.needed:
                library = self._find_library(name, path, info, exe_rpath, root)
                if library is None:
                    problems.append(f"{name} (needed by {path}) not found")
                    continue
                real = os.path.realpath(library)
                if real in seen:
                    continue
                seen.add(real)
                found.append(library)
                try:
                    queue.append((library, self.dynamic_info(library)))
                except Exception as err:  # noqa: BLE001
                    problems.append(f"cannot read {library}: {getattr(err, 'strerror', None) or err}")
        return found, problems

    def dynamic_info(self, path: str) -> DynamicInfo:
        """:func:`read_dynamic`, remembered by file identity (path, device, inode, mtime)."""
        stat = os.stat(path)
        key = (path, stat.st_dev, stat.st_ino, stat.st_mtime_ns)
        info = self._dynamic.get(key)
        if info is None:
            info = read_dynamic(path)
            self._dynamic.put(key, info)
        return info

    def ld_so_cache(self) -> dict[str, list[str]]:
        if self._ld_cache is None:
            self._ld_cache = read_ld_so_cache()
        return self._ld_cache

    def _find_library(self, name: str, needed_by: str, info: DynamicInfo, exe_rpath: tuple[str, ...],
                      root: DynamicInfo) -> str | None:
        if "/" in name:
            return name if _compatible(name, root) else None
        if info.runpath:
            dirs = _expand(info.runpath, needed_by)
        else:
            dirs = _expand(info.rpath, needed_by) + exe_rpath
        candidates = [os.path.join(d, name) for d in dirs]
        candidates += self.ld_so_cache().get(name, [])
        candidates += [os.path.join(d, name) for d in default_dirs(root.machine)]
        return next((c for c in candidates if _compatible(c, root)), None)


def _expand(dirs: tuple[str, ...], owner: str) -> tuple[str, ...]:
    """Substitute $ORIGIN (the owner's directory), $LIB and $PLATFORM as ld.so does."""
    origin = os.path.dirname(os.path.abspath(owner))
    expanded = []
    for directory in dirs:
        for token, value in (("ORIGIN", origin), ("LIB", "lib"), ("PLATFORM", platform.machine())):
            directory = directory.replace("${" + token + "}", value).replace("$" + token, value)
        if directory:
            expanded.append(directory)
    return tuple(expanded)


def default_dirs(machine: str) -> list[str]:
    triple = MULTIARCH.get(machine)
    multiarch = [f"/lib/{triple}", f"/usr/lib/{triple}"] if triple else []
    return multiarch + ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]


def read_ld_so_cache() -> dict[str, list[str]]:
    """soname -> paths, from ``ldconfig -p`` (empty when ldconfig is missing)."""
    try:
        output = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    cache: dict[str, list[str]] = {}
    for line in output.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow:
            cache.setdefault(name.split(" (")[0], []).append(path)
    return cache


def _compatible(path: str, root: DynamicInfo) -> bool:
    """ld.so skips files of another class or machine (e.g. a 32-bit lib in the search path). Reads
    only the ELF identification and e_machine (this runs for every candidate path)."""
    try:
        with open(path, "rb") as stream:
            header = stream.read(20)
    except OSError:  # missing or unreadable: not a candidate
        return False
    if len(header) < 20 or header[:4] != ELF_MAGIC or header[5] not in (1, 2):
        return False
    (machine,) = struct.unpack_from("<H" if header[5] == 1 else ">H", header, 18)
    return ELF_CLASS_BITS.get(header[4]) == root.elfclass and machine == ENUM_E_MACHINE.get(root.machine, root.machine)
