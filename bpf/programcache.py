"""Compiled BPF programs kept between runs, so that no compiler stands between launch and the first sample
once this machine has run optrace: BCC's compile took 1.1-1.3 s of CPU for the sampler with the CFI walker
(more under load), a stored program's load 0.02-0.05 s (the kernel's verifier is the rest).

An entry is the compiled program (bpf/compiled.py) under a key of everything the compile depends on:
  - the program's text (the prelude and its sources) and its cflags;
  - the compiler: libbcc.so's file (path, size, mtime), whose clang and LLVM are fixed with it;
  - the kernel: its release and build (``/proc/sys/kernel/version``), its build-id note
    (``/sys/kernel/notes``, which covers its BTF; else the BTF's own SHA-256), the BTF's size, the
    possible CPUs (a perf output has a slot per CPU) and the kernel headers the compile may read (the
    resolved ``/lib/modules/RELEASE/build`` and ``source`` and their Makefiles' identity);
  - optrace's version and the code that writes and reads an entry (this module, compiled.py, bcccompile.py).
A kernel, a header package, a BCC or a program change is a new key: a miss, a compile, never a wrong
program. The entry's header repeats its key, so an entry copied under another entry's name (another
program, another kernel) is refused, and the whole program is in the checksummed payload (the header
only names it); the rest is the cache directory's (optrace/cachedir.py: root's in
/var/cache/optrace/programs, private, checksummed, bounded, least recently used out first).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from optrace import __version__
from optrace.bpf.abi import POSSIBLE_CPUS
from optrace.bpf.compiled import CompiledError, CompiledProgram, decode, encode
from optrace.cachedir import CacheDirectory, default_directory
from optrace.kernel import VMLINUX_BTF, read_kernel_file

KIND = "programs"
MAGIC = b"optrace bpf program 1\n"
MAX_PROGRAM_BYTES = 8 << 20
MAX_STORE_BYTES = 64 << 20
# The modules whose code decides what an entry holds and how it is read back
FORMAT_MODULES = ("programcache.py", "compiled.py", "bcccompile.py")
KERNEL_NOTES = Path("/sys/kernel/notes")
MAX_NOTES = 1 << 16
LIBRARY_DIRS = ("/usr/lib/{arch}-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib/{arch}-linux-gnu")
COMPILER_LIBRARY = "libbcc.so.0"
MODULES = Path("/lib/modules")


@dataclass(frozen=True)
class ProgramKey:
    """An entry's name and what its header must say: ``digest`` names it, ``sources`` and ``text_sha256``
    tell doctor which program it is."""

    digest: str
    sources: tuple[str, ...]
    text_sha256: str

    @property
    def name(self) -> str:
        return self.digest[:40]


def program_key(text: bytes, cflags: Sequence[str], sources: Sequence[str]) -> ProgramKey:
    text_sha = hashlib.sha256(text).hexdigest()
    parts = [format_fingerprint(), text_sha, list(cflags), compiler_identity(), kernel_identity()]
    return ProgramKey(hashlib.sha256(json.dumps(parts).encode()).hexdigest(), tuple(sources), text_sha)


@functools.cache
def format_fingerprint() -> str:
    digest = hashlib.sha256(__version__.encode())
    for name in FORMAT_MODULES:
        digest.update(Path(__file__).with_name(name).read_bytes())
    return digest.hexdigest()


def _file_identity(path: str) -> list:
    try:
        info = os.stat(path)
    except OSError:
        return [path, None]
    return [os.path.realpath(path), info.st_ino, info.st_size, info.st_mtime_ns]


@functools.cache
def compiler_identity() -> list:
    """libbcc.so's file as the dynamic loader would find it (the usual directories; a miss only costs a
    compile)."""
    arch = os.uname().machine
    for directory in LIBRARY_DIRS:
        path = os.path.join(directory.format(arch=arch), COMPILER_LIBRARY)
        if os.path.exists(path):
            return _file_identity(path)
    return [COMPILER_LIBRARY, None]


@functools.cache
def kernel_identity() -> dict:
    release = os.uname().release
    identity = {"release": release, "version": _read_text("/proc/sys/kernel/version"),
                "possible_cpus": _read_text(str(POSSIBLE_CPUS))}
    notes = read_kernel_file(KERNEL_NOTES, MAX_NOTES)
    try:
        btf_size = os.stat(VMLINUX_BTF).st_size
    except OSError:
        btf_size = None
    identity["btf_size"] = btf_size
    if notes:
        identity["notes_sha256"] = hashlib.sha256(notes).hexdigest()
    elif btf_size is not None:
        identity["btf_sha256"] = hashlib.sha256(read_kernel_file(Path(VMLINUX_BTF), 64 << 20) or b"").hexdigest()
    identity["headers"] = [_file_identity(str(MODULES / release / part / "Makefile")) for part in ("build", "source")]
    return identity


def _read_text(path: str) -> str | None:
    data = read_kernel_file(path, 4096)
    return None if data is None else data.decode(errors="replace").strip()


class ProgramCache:
    """The stored programs of one directory (None: none kept). ``stats``: the cache directory's counts."""

    def __init__(self, directory: Path | None) -> None:
        self.entries = CacheDirectory(directory, MAGIC, MAX_PROGRAM_BYTES, MAX_STORE_BYTES)

    @classmethod
    def default(cls) -> "ProgramCache":
        return cls(default_directory(KIND))

    @property
    def problem(self) -> str | None:
        return self.entries.problem

    @property
    def stats(self) -> dict[str, int]:
        return self.entries.stats

    def close(self) -> None:
        self.entries.close()

    def load(self, key: ProgramKey) -> CompiledProgram | None:
        """The program stored under ``key``, or None (not stored, or not a good entry of that key)."""
        entry = self.entries.read(key.name)
        if entry is None:
            return None
        header, payload = entry
        try:
            if header.get("key") != key.digest:
                raise CompiledError("the entry is another program's")
            program = decode(payload)
        except CompiledError:
            self.entries.rejected()
            return None
        self.entries.accepted(key.name)
        return program

    def save(self, key: ProgramKey, program: CompiledProgram) -> None:
        header = {"key": key.digest, "sources": list(key.sources), "text_sha256": key.text_sha256,
                  "kernel": kernel_identity(), "compiler": compiler_identity(), "format": format_fingerprint()}
        self.entries.write(key.name, header, encode(program))

    def current_headers(self) -> list[dict]:
        """The headers of the good entries stored for this kernel, compiler and optrace (doctor: which
        programs a run would load without a compiler; their text is the caller's to compare)."""
        now = {"kernel": kernel_identity(), "compiler": compiler_identity(), "format": format_fingerprint()}
        headers = [entry[0] for entry in map(self.entries.read, self.entries.names()) if entry is not None]
        return [header for header in headers if all(header.get(name) == value for name, value in now.items())]
