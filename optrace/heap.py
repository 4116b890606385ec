"""Give freed heap memory back to the system (glibc's ``malloc_trim``).

glibc keeps freed heap memory in the process unless told otherwise, so a long-running exporter's
RSS would stay at the highest point it ever reached. Two callers free a lot at once: loading a
symbol table allocates several times its final size for a moment (section data, one object per
symbol), and BCC's compile (clang/LLVM, in process) frees about 60 MB once a BPF program is loaded
(about 50 MB of `optrace serve`'s RSS). Other C libraries: a no-op.
"""
from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # the symbols already loaded: libc's own
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """True when the C library gave memory back."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
