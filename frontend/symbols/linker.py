"""Which shared libraries an executable loads, found the way the dynamic linker (ld.so(8)) finds them:
DT_RPATH (only without DT_RUNPATH) with $ORIGIN, DT_RUNPATH, /etc/ld.so.cache, then the default dirs.

Used for executables seen at exec time: their process may be gone before its maps can be read.

Every candidate is opened through fileaccess (non-blocking, regular disk files only: a DT_NEEDED that
is a FIFO, a device or a /proc file is refused at once, with a counted warning). Symlinks:
ld.so.cache entries and the default dirs are the system's own configuration and are followed. The
RPATH/RUNPATH dirs ($ORIGIN included) come from the user's ELF file, so no symlink is followed there,
except the soname convention: a library name that is a symlink to a plain file name, i.e. to a sibling
in the same directory (libfoo.so.1 -> libfoo.so.1.2.3), which is then opened without symlinks. A
library behind a symlinked RPATH directory is therefore not indexed (its frames can still be named
from the maps snapshot of a process that maps it).
"""
from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from optrace.fileaccess import RefusedFile
from optrace.frontend.symbols.access import FileProblems, FileRef, open_ref
from optrace.frontend.symbols.elffile import ELF_MAGIC, EM_386, EM_AARCH64, EM_X86_64, SHT_DYNAMIC, ElfFile
from optrace.frontend.symbols.lru import LruCache

ELF_CLASS_BITS = {1: 32, 2: 64}  # EI_CLASS -> elfclass
MULTIARCH = {EM_X86_64: "x86_64-linux-gnu", EM_AARCH64: "aarch64-linux-gnu", EM_386: "i386-linux-gnu"}
DT_NULL, DT_NEEDED, DT_RPATH, DT_RUNPATH = 0, 1, 15, 29
MAX_DYNAMIC_BYTES = 64 << 10  # a dynamic section (real ones: under 1 KB)
MAX_DYNAMIC_SECTIONS = 4
MAX_NEEDED = 1024  # DT_NEEDED entries of one object
MAX_LIBRARIES = 4096  # libraries of one executable, transitively
MAX_SIBLING_HOPS = 4  # libfoo.so.1 -> libfoo.so.1.2 -> libfoo.so.1.2.3
NATIVE_CACHE_FLAGS = {"x86_64": "x86-64", "aarch64": "AArch64"}  # as `ldconfig -p` prints them

Identity = tuple[int, int]


@dataclass(frozen=True)
class DynamicInfo:
    machine: int  # e_machine, e.g. 62 (EM_X86_64)
    elfclass: int
    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()


def read_dynamic(stream: BinaryIO) -> DynamicInfo:
    """DT_NEEDED / DT_RPATH / DT_RUNPATH of the ELF object in ``stream``. Raises ElfFormatError,
    BudgetExceeded, OSError."""
    elf = ElfFile(stream)
    tags: dict[int, list[str]] = {DT_NEEDED: [], DT_RPATH: [], DT_RUNPATH: []}
    layout = elf.endian + ("qQ" if elf.elfclass == 64 else "iI")
    entry = struct.calcsize(layout)
    for section in elf.sections_of_type(SHT_DYNAMIC)[:MAX_DYNAMIC_SECTIONS]:
        data = elf.section_data(section, MAX_DYNAMIC_BYTES)
        strings = elf.section(section.link)
        for tag, value in struct.iter_unpack(layout, data[:len(data) - len(data) % entry]):
            if tag == DT_NULL:
                break
            if tag in tags and len(tags[tag]) < MAX_NEEDED:
                tags[tag].append(elf.read_string(strings, value))
    split = [part for value in tags[DT_RPATH] for part in value.split(":")]
    runsplit = [part for value in tags[DT_RUNPATH] for part in value.split(":")]
    return DynamicInfo(elf.machine, elf.elfclass, tuple(tags[DT_NEEDED]), tuple(split), tuple(runsplit))


@dataclass(frozen=True)
class _Object:
    ref: FileRef
    identity: Identity
    info: DynamicInfo


class Linker:
    """Resolves DT_NEEDED like ld.so, for one Symbolizer: the ld.so.cache listing is read once, and each
    object's dynamic section once per file version (libc is needed by every program: parsing the
    libraries again for each new executable made this ~10x slower, 20 ms instead of 2 ms a program).
    Problems of single files are reported to ``problems`` (counted warnings)."""

    def __init__(self, problems: FileProblems | None = None, max_cached: int = 4096) -> None:
        self._problems = problems or FileProblems(lambda message: None, {})
        self._ld_cache: dict[str, list[str]] | None = None
        self._dynamic: LruCache[tuple[str, int, int, int], DynamicInfo] = LruCache(max_cached)
        self._reported = 0  # candidate files reported as bad (a name with one is not also "not found")

    def needed_libraries(self, executable: str) -> tuple[list[FileRef], list[str]]:
        """All libraries ``executable`` (an execve'd path: symlinks followed, see FileRef) loads,
        transitively; and a line for each library that could not be found (one whose candidate file
        was refused or malformed has had its warning already)."""
        root = self._object(FileRef(executable, executable, follow_symlinks=True), None, "its libraries are not indexed")
        if root is None:
            return [], []
        exe_rpath = () if root.info.runpath else _expand(root.info.rpath, _origin(root, root))
        queue = deque([root])
        seen = {root.identity}
        found: list[FileRef] = []
        missing: list[str] = []
        while queue and len(found) < MAX_LIBRARIES:
            owner = queue.popleft()
            for name in owner.info.needed:
                reported = self._reported
                library = self._find_library(name, owner, exe_rpath, root)
                if library is None and reported == self._reported:
                    missing.append(f"{name} (needed by {owner.ref.name}) not found")
                elif library is not None and library.identity not in seen:
                    seen.add(library.identity)
                    found.append(library.ref)
                    queue.append(library)
        return found, missing

    def ld_so_cache(self) -> dict[str, list[str]]:
        if self._ld_cache is None:
            self._ld_cache = read_ld_so_cache()
        return self._ld_cache

    def _find_library(self, name: str, owner: _Object, exe_rpath: tuple[str, ...], root: _Object) -> _Object | None:
        for candidate in self._candidates(name, owner, exe_rpath, root):
            found = self._object(candidate, root.info, f"it is not used as {name}")
            if found is not None:
                return found
        return None

    def _candidates(self, name: str, owner: _Object, exe_rpath: tuple[str, ...], root: _Object) -> Iterator[FileRef]:
        """The paths ld.so tries, in order, each with whether its symlinks may be followed."""
        if "/" in name:
            if os.path.isabs(name):
                yield FileRef(name, name)
            return
        info = owner.info
        origin = _origin(owner, root)
        dirs = _expand(info.runpath, origin) if info.runpath else _expand(info.rpath, origin) + exe_rpath
        for directory in dirs:  # ".." resolved lexically: no symlink is followed in these dirs anyway
            path = os.path.normpath(os.path.join(directory, name))
            yield FileRef(path, path)
        for path in self.ld_so_cache().get(name, []):
            yield FileRef(path, path, follow_symlinks=True)
        for directory in default_dirs(root.info.machine):
            path = os.path.join(directory, name)
            yield FileRef(path, path, follow_symlinks=True)

    def _object(self, ref: FileRef, root: DynamicInfo | None, consequence: str, hops: int = 0) -> _Object | None:
        """The ELF object at ``ref`` if it exists and suits ``root`` (None: skip it); the one boundary
        for each candidate file. ``hops``: sibling symlinks followed so far."""
        try:
            return self._read_object(ref, root)
        except FileNotFoundError:
            return None
        except RefusedFile as refused:
            sibling = _sibling_of(ref) if refused.reason == "symlink" and hops < MAX_SIBLING_HOPS else None
            if sibling is not None:
                return self._object(sibling, root, consequence, hops + 1)
            self._report(ref, refused, consequence)
        except Exception as err:  # noqa: BLE001 - a bad library costs its own names only
            self._report(ref, err, consequence)
        return None

    def _report(self, ref: FileRef, err: Exception, consequence: str) -> None:
        self._reported += 1
        self._problems.report(ref.name, err, consequence)

    def _read_object(self, ref: FileRef, root: DynamicInfo | None) -> _Object | None:
        with open_ref(ref) as stream:
            if root is not None and not _compatible(stream.read(20), root):
                return None  # ld.so skips it too
            info = os.fstat(stream.fd)
            key = (ref.read_path or ref.name, info.st_dev, info.st_ino, info.st_mtime_ns)
            dynamic = self._dynamic.get(key)
            if dynamic is None:
                dynamic = read_dynamic(stream)
                self._dynamic.put(key, dynamic)
        return _Object(ref, (info.st_dev, info.st_ino), dynamic)


def _sibling_of(ref: FileRef) -> FileRef | None:
    """The target of a symlinked library name when it is a plain name in the same directory."""
    try:
        target = os.readlink(ref.read_path)
    except (OSError, TypeError):
        return None
    if not target or "/" in target or target in (".", ".."):
        return None
    path = os.path.join(os.path.dirname(ref.read_path), target)
    return FileRef(path, path)


def _origin(owner: _Object, program: _Object) -> str:
    """ld.so's $ORIGIN: the directory of the program's real path (an execve'd path, whose symlinks
    the kernel followed: /usr/bin/java -> /etc/alternatives/java -> /usr/lib/jvm/.../bin/java), of a
    library's path as found. Bound: the real path counts only if it is the very file that was opened
    and checked (same device and inode; a link swapped in between gives the unresolved directory), and
    the kernel's own limit on symlink hops applies (realpath stops at a loop)."""
    path = owner.ref.read_path or owner.ref.name
    if owner is not program:
        return os.path.dirname(os.path.abspath(path))
    real = os.path.realpath(path)
    try:
        info = os.stat(real)
    except OSError:
        info = None
    same = info is not None and (info.st_dev, info.st_ino) == program.identity
    return os.path.dirname(real if same else os.path.abspath(path))


def _expand(dirs: tuple[str, ...], origin: str) -> tuple[str, ...]:
    """Substitute $ORIGIN (the owner's directory), $LIB and $PLATFORM as ld.so does."""
    expanded = []
    for directory in dirs:
        for token, value in (("ORIGIN", origin), ("LIB", "lib"), ("PLATFORM", platform.machine())):
            directory = directory.replace("${" + token + "}", value).replace("$" + token, value)
        if directory:
            expanded.append(directory)
    return tuple(expanded)


def default_dirs(machine: int) -> list[str]:
    triple = MULTIARCH.get(machine)
    multiarch = [f"/lib/{triple}", f"/usr/lib/{triple}"] if triple else []
    return multiarch + ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]


def read_ld_so_cache() -> dict[str, list[str]]:
    """soname -> paths, from ``ldconfig -p``, this machine's native libraries first (a 32-bit libc
    is listed too); empty when ldconfig is missing."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"  # root's PATH may lack /sbin
    try:
        output = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = []
    for line in output.splitlines():
        head, arrow, path = line.strip().partition(" => ")
        if arrow:
            soname, _, flags = head.partition(" (")
            rows.append((soname, flags, path))
    native = NATIVE_CACHE_FLAGS.get(platform.machine(), "")
    cache: dict[str, list[str]] = {}
    for soname, _flags, path in sorted(rows, key=lambda row: native not in row[1]):
        cache.setdefault(soname, []).append(path)
    return cache


def find_library(name: str, ld_so_cache: dict[str, list[str]]) -> str | None:
    """The existing cached library ``name`` names, as ``-lNAME`` would: ``c`` and ``libc`` give
    libc.so.6 (also libc.so when cached), ``libm.so.6`` only itself; None when none."""
    if ".so" in name:
        candidates = ld_so_cache.get(name, [])
    else:
        stem = name if name.startswith("lib") else f"lib{name}"
        candidates = [path for soname, paths in ld_so_cache.items()
                      if soname == f"{stem}.so" or soname.startswith(f"{stem}.so.") for path in paths]
    return next((path for path in candidates if os.path.exists(path)), None)


def _compatible(header: bytes, root: DynamicInfo) -> bool:
    """ld.so skips files of another class or machine (e.g. a 32-bit lib in the search path); ``header``
    is the file's first 20 bytes (the ELF identification and e_machine)."""
    if len(header) < 20 or header[:4] != ELF_MAGIC or header[5] not in (1, 2):
        return False
    (machine,) = struct.unpack_from("<H" if header[5] == 1 else ">H", header, 18)
    return ELF_CLASS_BITS.get(header[4]) == root.elfclass and machine == root.machine
