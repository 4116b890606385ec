"""Loading a BPF program through BCC: the one place that imports bcc and compiles C."""
from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Sequence
from pathlib import Path

from optrace.bpf.btf import KernelOffsets, kernel_offsets
from optrace.bpf.kallsymsview import start_compile
from optrace.errors import OptraceError
from optrace.kernel import VMLINUX_BTF
from optrace.heap import release_free_memory
from optrace.procfs import read_maps


def import_bcc():
    try:
        import bcc
    except ImportError as exc:
        raise OptraceError("BCC is not importable (Debian package python3-bpfcc): run sudo make setup") from exc
    return bcc


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


def load_bcc(sources: Sequence[Path], cflags: Sequence[str] = (), kernel_headers: bool | None = None):
    """``bcc.BPF`` of the sources (after :data:`PRELUDE`), with BCC's absence or a failed compile as an
    OptraceError; the kernel's field offsets (read from its BTF while clang compiles on its own thread,
    see kallsymsview.py, which releases the GIL) are set before anything is attached by the caller.

    The programs are compiled against kernel_types.h's own declarations, not the kernel headers (0.5 s
    instead of 1.3 s here), where the kernel's BTF gives the offsets of the fields they read and the
    layouts are x86_64's; else (or with ``kernel_headers=True``) against the headers.

    Clang and LLVM free what the compile took (about 60 MB here), but glibc keeps freed heap
    mapped: it is handed back to the system at once, and the compiler's code pages are dropped from
    this process's page tables, so a long-running `optrace serve` does not carry the compile's memory
    for its whole life (113 MB of RSS after the compile, 37 MB after both)."""
    bcc = import_bcc()
    text = "".join(path.read_text() for path in (*PRELUDE, *sources)).encode()
    if kernel_headers is None:
        kernel_headers = not own_types_apply()
    compiling = start_compile(lambda: _compiled(bcc, text, cflags, kernel_headers))
    offsets = kernel_offsets()
    program = compiling.result()
    if offsets is None and not kernel_headers:  # unreadable BTF after all: the headers' offsets
        program.cleanup()
        program = start_compile(lambda: _compiled(bcc, text, cflags, True)).result()
    set_kernel_offsets(program, offsets)
    release_free_memory()
    release_compiler_code()
    return program


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
    return platform.machine() == "x86_64" and os.path.exists(VMLINUX_BTF)


def _compiled(bcc, text: bytes, cflags: Sequence[str], kernel_headers: bool):
    flags = [*cflags, "-DKERNEL_HEADERS"] if kernel_headers else list(cflags)
    try:
        return bcc.BPF(text=text, cflags=flags)
    except Exception as exc:
        raise OptraceError(f"cannot load the BPF program: {exc} (optrace doctor tells what is missing)") from exc


def set_kernel_offsets(program, offsets: KernelOffsets | None) -> None:
    if offsets is None:
        return
    table = program[b"kernel_offsets"]
    values = (offsets.task_tgid, offsets.binprm_filename, offsets.task_fsbase, offsets.task_state)
    for index, value in enumerate(values):  # enum kernel_offset
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
