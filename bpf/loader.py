"""Loading a BPF program: stored (bpf/programcache.py) when this machine compiled it before, else compiled by
BCC (bpf/bcccompile.py, the one place that imports bcc) and stored; either way a program object with BCC's
interface (bpf/programobject.py)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from optrace.bpf.compiled import CompiledProgram
from optrace.bpf.programcache import ProgramCache, program_key
from optrace.bpf.programobject import ProgramObject
from optrace.errors import OptraceError
from optrace.kernel import VMLINUX_BTF
from optrace.procfs import read_maps


def counter_increments(table, reasons: tuple[str, ...], seen: list[int]) -> dict[str, int]:
    """What a per-CPU array of counters (index i counts ``reasons[i]``) added since the last call, whose
    totals ``seen`` holds (updated here): the counters themselves only grow."""
    delta = {}
    for i, reason in enumerate(reasons):
        total = sum(table[table.Key(i)])
        if total > seen[i]:
            delta[reason] = total - seen[i]
        seen[i] = total
    return delta


PRELUDE = tuple(Path(__file__).with_name(name) for name in ("kernel_types.h", "kernel_offsets.h", "table_bytes.h"))


@dataclass(frozen=True)
class ProgramLoad:
    """One program this process loaded: its sources, whether it was ``compiled`` (else stored), how long the
    load took (seconds of wall time), and why no program is stored when the cache cannot be used."""

    sources: tuple[str, ...]
    compiled: bool
    seconds: float
    cache_problem: str | None = None

    @property
    def name(self) -> str:
        return "+".join(self.sources)

    @property
    def how(self) -> str:
        """"stored" (loaded from the program cache: no compiler), "compiled" (and stored for the next runs),
        or "compiled, not stored" (the cache cannot be used: ``cache_problem``)."""
        if not self.compiled:
            return "stored"
        return "compiled, not stored" if self.cache_problem else "compiled"


def loads_summary(loads: Sequence[ProgramLoad]) -> str:
    """One line for -v and serve's log: each program, whether it compiled, how long its load took."""
    parts = [f"{load.name} {load.how} ({load.seconds:.2f} s)" for load in loads]
    problems = sorted({load.cache_problem for load in loads if load.cache_problem})
    return "BPF programs: " + ("; ".join(parts) or "none loaded") + "".join(f" [{problem}]" for problem in problems)


_loads: list[ProgramLoad] = []
_loads_lock = threading.Lock()


def program_loads() -> list[ProgramLoad]:
    """The programs this process has loaded so far (record's meta, -v, serve's log say which compiled)."""
    with _loads_lock:
        return list(_loads)


def load_bcc(sources: Sequence[Path], cflags: Sequence[str] = (), kernel_headers: bool | None = None):
    """The program of the sources (after :data:`PRELUDE`) with its maps created, the kernel's field
    offsets (from its BTF) set, nothing attached but BCC's auto-attached tracepoints; BCC's absence or a
    failed compile is an OptraceError.

    The programs are compiled against kernel_types.h's own declarations, not the kernel headers (0.5 s
    instead of 1.3 s here), where the kernel's BTF gives the offsets of the fields they read and the
    layouts are x86_64's; else (or with ``kernel_headers=True``) against the headers. A program compiled
    against the headers because the BTF could not be read after all is not stored."""
    started = time.monotonic()
    text = program_text(sources)
    if kernel_headers is None:
        kernel_headers = not own_types_apply()
    key = program_key(text, _flags(cflags, kernel_headers), [path.name for path in sources])
    cache = ProgramCache.default()
    try:
        compiled, map_fds = cache.load(key), None
        if compiled is None:
            compiled, map_fds = _compiled(text, cflags, kernel_headers)
            if kernel_headers or compiled.kernel_offsets is not None:  # not a fallback: the next run tries again
                cache.save(key, compiled)
        problem = cache.problem
    finally:
        cache.close()
    program = ProgramObject(compiled, map_fds)
    set_kernel_offsets(program, compiled.kernel_offsets)
    with _loads_lock:
        _loads.append(ProgramLoad(key.sources, map_fds is not None, time.monotonic() - started, problem))
    return program


def program_text(sources: Sequence[Path]) -> bytes:
    return "".join(path.read_text() for path in (*PRELUDE, *sources)).encode()


def stored_programs() -> tuple[dict[str, int], str | None]:
    """The programs stored for this kernel, compiler and optrace (by name: how many builds, one per set of
    options), and why none can be stored (the cache's problem, or None). For doctor."""
    cache = ProgramCache.default()
    try:
        current = cache.current_headers()
        problem = cache.problem
    finally:
        cache.close()
    builds: dict[str, int] = {}
    texts: dict[tuple[str, ...], str] = {}
    here = Path(__file__).parent
    for header in current:
        sources = tuple(str(name) for name in header.get("sources", ()))
        if sources not in texts:
            paths = [here / name for name in sources]
            texts[sources] = hashlib.sha256(program_text(paths)).hexdigest() if all(
                path.name == str(path.relative_to(here)) and path.is_file() for path in paths) else ""
        if texts[sources] and header.get("text_sha256") == texts[sources]:
            builds["+".join(sources)] = builds.get("+".join(sources), 0) + 1
    return builds, problem


def _flags(cflags: Sequence[str], kernel_headers: bool) -> list[str]:
    return [*cflags, "-DKERNEL_HEADERS"] if kernel_headers else list(cflags)


def _compiled(text: bytes, cflags: Sequence[str], kernel_headers: bool) -> tuple[CompiledProgram, list[int]]:
    """BCC's compile, on a thread of its own (see kallsymsview.py, which releases the GIL) while the
    kernel's field offsets are read from its BTF; against the headers when the BTF is unreadable after all.

    Clang and LLVM free what the compile took (about 60 MB here), but glibc keeps freed heap
    mapped: it is handed back to the system at once, and the compiler's code pages are dropped from
    this process's page tables, so a long-running `optrace serve` does not carry the compile's memory
    for its whole life (113 MB of RSS after the compile, 37 MB after both). Imported here: a stored program
    needs none of it."""
    from optrace.bpf.bcccompile import compile_program
    from optrace.bpf.btf import kernel_offsets
    from optrace.bpf.kallsymsview import start_compile
    from optrace.heap import release_free_memory

    compiling = start_compile(lambda: compile_program(text, _flags(cflags, kernel_headers)))
    offsets = kernel_offsets()
    compiled, map_fds = compiling.result()
    if offsets is None and not kernel_headers:  # unreadable BTF after all: the headers' offsets
        for fd in map_fds:
            os.close(fd)
        compiled, map_fds = start_compile(lambda: compile_program(text, _flags(cflags, True))).result()
    if offsets is not None:
        compiled = replace(compiled, kernel_offsets=offsets.values())
    release_free_memory()
    release_compiler_code()
    return compiled, map_fds


def load_function(program, name: bytes, prog_type: int, **kw):
    """``program.load_func``: the kernel's refusal of a program is an OptraceError that names it (BCC
    compiles a program's functions, the kernel verifies each when it is loaded)."""
    try:
        return program.load_func(name, prog_type, **kw)
    except Exception as exc:
        raise OptraceError(f"the kernel did not load the BPF program {name.decode()}: {exc} "
                           "(optrace doctor tells what is missing)") from exc


def own_types_apply() -> bool:
    """Whether kernel_types.h's declarations hold for this kernel: x86_64, with BTF for the offsets."""
    return os.uname().machine == "x86_64" and os.path.exists(VMLINUX_BTF)


def set_kernel_offsets(program, offsets: Sequence[int] | None) -> None:
    """The programs' kernel field offsets (enum kernel_offset's order: btf.KernelOffsets.values)."""
    if offsets is None:
        return
    table = program[b"kernel_offsets"]
    for index, value in enumerate(offsets):
        table[table.Key(index)] = table.Leaf(value)


COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc")
MADV_DONTNEED = 4


def release_compiler_code() -> int:
    """Unmap from this process's page tables the pages of clang's and LLVM's machine code that the
    compile touched (about 80 MB of RSS here, more than the rest of the process): the code stays in the
    page cache, shared with other processes, and a later compile faults back what it runs. Only the
    executable mappings: they are never written, so nothing private is lost (a library's writable or
    relocated read-only data would be). Returns the bytes released from the page tables."""
    libc = ctypes.CDLL(None, use_errno=True)
    released = 0
    maps = read_maps("self")
    for entry in maps.entries if maps is not None else ():
        if entry.perms != "r-xp" or not any(lib in entry.path for lib in COMPILER_LIBRARIES):
            continue
        if libc.madvise(ctypes.c_void_p(entry.start), ctypes.c_size_t(entry.end - entry.start), MADV_DONTNEED) == 0:
            released += entry.end - entry.start
    return released
