"""BCC's BPF primitives without its compiler: libbcc_bpf.so (Debian's libbpfcc ships it beside libbcc.so).

It holds what BCC's Python calls once a program is compiled, the same C code: map element operations and
batches, perf buffer readers (perf_reader), ring buffers, the attach calls for perf events and
tracepoints. libbcc.so holds the same functions plus the compiler, and loading it maps clang and LLVM:
19 ms of CPU and 62 MB of RSS here, against 1.6 ms and 2.2 MB for this library (measured with
``ctypes.CDLL`` in a fresh python3). The declarations are BCC 0.26's (bcc/libbcc.py), for the functions
optrace calls.
"""
from __future__ import annotations

import ctypes as ct

from optrace.errors import OptraceError

LIBRARY = "libbcc_bpf.so.0"

RAW_CB_TYPE = ct.CFUNCTYPE(None, ct.py_object, ct.c_void_p, ct.c_int)
LOST_CB_TYPE = ct.CFUNCTYPE(None, ct.py_object, ct.c_ulonglong)
RINGBUF_CB_TYPE = ct.CFUNCTYPE(ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_int)


class PerfBufferOpts(ct.Structure):
    """struct bcc_perf_buffer_opts."""

    _fields_ = [("pid", ct.c_int), ("cpu", ct.c_int), ("wakeup_events", ct.c_int)]


_DECLARATIONS = {  # name: (restype, argtypes)
    "bpf_lookup_elem": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p]),
    "bpf_update_elem": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_ulonglong]),
    "bpf_delete_elem": (ct.c_int, [ct.c_int, ct.c_void_p]),
    "bpf_get_first_key": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_uint]),
    "bpf_get_next_key": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p]),
    "bpf_lookup_batch": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_uint32), ct.POINTER(ct.c_uint32), ct.c_void_p,
                                    ct.c_void_p, ct.c_void_p]),
    "bpf_lookup_and_delete_batch": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_uint32), ct.POINTER(ct.c_uint32),
                                               ct.c_void_p, ct.c_void_p, ct.c_void_p]),
    "bpf_attach_perf_event": (ct.c_int, [ct.c_int, ct.c_uint, ct.c_uint, ct.c_ulonglong, ct.c_ulonglong, ct.c_int,
                                         ct.c_int, ct.c_int]),
    "bpf_attach_tracepoint": (ct.c_int, [ct.c_int, ct.c_char_p, ct.c_char_p]),
    "bpf_attach_raw_tracepoint": (ct.c_int, [ct.c_int, ct.c_char_p]),
    "bpf_close_perf_event_fd": (ct.c_int, [ct.c_int]),
    "bpf_open_perf_buffer_opts": (ct.c_void_p, [RAW_CB_TYPE, LOST_CB_TYPE, ct.py_object, ct.c_int,
                                                ct.POINTER(PerfBufferOpts)]),
    "perf_reader_consume": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_void_p)]),
    "perf_reader_poll": (ct.c_int, [ct.c_int, ct.POINTER(ct.c_void_p), ct.c_int]),
    "perf_reader_free": (None, [ct.c_void_p]),
    "perf_reader_fd": (int, [ct.c_void_p]),
    "bpf_new_ringbuf": (ct.c_void_p, [ct.c_int, RINGBUF_CB_TYPE, ct.c_void_p]),
    "bpf_add_ringbuf": (ct.c_int, [ct.c_void_p, ct.c_int, RINGBUF_CB_TYPE, ct.c_void_p]),
    "bpf_poll_ringbuf": (ct.c_int, [ct.c_void_p, ct.c_int]),
    "bpf_consume_ringbuf": (ct.c_int, [ct.c_void_p]),
    "bpf_free_ringbuf": (None, [ct.c_void_p]),
}


def _load() -> ct.CDLL:
    try:
        library = ct.CDLL(LIBRARY, use_errno=True)
    except OSError as exc:
        raise OptraceError(f"cannot load {LIBRARY} (Debian package libbpfcc): {exc}; run sudo make setup") from exc
    for name, (restype, argtypes) in _DECLARATIONS.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library


class _Library:
    """The library, loaded at the first call (an import of this module costs nothing)."""

    _loaded: ct.CDLL | None = None

    def __getattr__(self, name: str):
        if _Library._loaded is None:
            _Library._loaded = _load()
        return getattr(_Library._loaded, name)


lib = _Library()
