"""BCC's compile (clang and LLVM inside libbcc.so), described as data (bpf/compiled.py): the only place that
imports BCC, taken only when no stored program fits (bpf/programcache.py).

BCC's module is used directly, not ``bcc.BPF``: that object also loads and attaches every
``raw_tracepoint__``/``tracepoint__`` function at once, which the program object does (bpf/programobject.py)
whether the program was compiled or stored. The maps the compile created are handed over to the program
object (their fds duplicated before the module goes), so a compile creates no map twice.
"""
from __future__ import annotations

import ctypes as ct
import os
from collections.abc import Sequence

from optrace.bpf.compiled import CompiledError, CompiledProgram, FunctionSpec, TableSpec, relocations
from optrace.errors import OptraceError

# Module accessors BCC's Python leaves undeclared (a module pointer passed as a C int crashed once it
# lived in a thread's heap, see tests/core/test_table_bytes.py)
_UNDECLARED = {
    "bpf_num_tables": (ct.c_ulonglong, [ct.c_void_p]),
    "bpf_table_name": (ct.c_char_p, [ct.c_void_p, ct.c_ulonglong]),
    "bpf_table_fd_id": (ct.c_int, [ct.c_void_p, ct.c_ulonglong]),
    "bpf_table_key_size_id": (ct.c_size_t, [ct.c_void_p, ct.c_ulonglong]),
    "bpf_table_leaf_size_id": (ct.c_size_t, [ct.c_void_p, ct.c_ulonglong]),
}


def import_bcc():
    try:
        import bcc
    except ImportError as exc:
        raise OptraceError("BCC is not importable (Debian package python3-bpfcc): run sudo make setup") from exc
    return bcc


def bcc_library():
    """libbcc.so as BCC's Python declared it, with the module accessors it leaves out."""
    lib = import_bcc().lib
    for name, (restype, argtypes) in _UNDECLARED.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


def compile_program(text: bytes, cflags: Sequence[str]) -> tuple[CompiledProgram, list[int]]:
    """The compiled program and its maps' fds (the caller's to close)."""
    lib = bcc_library()
    flags = (ct.c_char_p * len(cflags))(*(flag.encode() for flag in cflags))
    module = lib.bpf_module_create_c_from_string(text, 0, flags, len(flags), True, None)
    if not module:
        raise OptraceError("cannot load the BPF program: BCC failed to compile it (its errors are above; "
                           "optrace doctor tells what is missing)")
    fds: list[int] = []
    try:
        tables = []
        for index in range(lib.bpf_num_tables(module)):
            tables.append(_table(lib, module, index))
            fds.append(os.dup(lib.bpf_table_fd_id(module, index)))
        table_of_fd = {lib.bpf_table_fd_id(module, index): index for index in range(len(tables))}
        try:
            functions = tuple(_function(lib, module, index, table_of_fd)
                              for index in range(lib.bpf_num_functions(module)))
        except CompiledError as exc:
            raise OptraceError(f"internal error: a BPF program optrace cannot load without BCC: {exc}") from exc
        compiled = CompiledProgram(license=lib.bpf_module_license(module), kern_version=lib.bpf_module_kern_version(module),
                                   tables=tuple(tables), functions=functions)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        lib.bpf_module_destroy(module)
    return compiled, fds


def _table(lib, module: int, index: int) -> TableSpec:
    name = lib.bpf_table_name(module, index)
    fields = tuple(lib.bpf_perf_event_field(module, name, i).decode()
                   for i in range(lib.bpf_perf_event_fields(module, name)))
    return TableSpec(name=name, map_type=lib.bpf_table_type_id(module, index),
                     key_size=lib.bpf_table_key_size_id(module, index), value_size=lib.bpf_table_leaf_size_id(module, index),
                     max_entries=lib.bpf_table_max_entries_id(module, index), flags=lib.bpf_table_flags_id(module, index),
                     key_desc=lib.bpf_table_key_desc(module, name).decode(),
                     leaf_desc=lib.bpf_table_leaf_desc(module, name).decode(), event_fields=fields)


def _function(lib, module: int, index: int, table_of_fd: dict[int, int]) -> FunctionSpec:
    name = lib.bpf_function_name(module, index)
    insns = ct.string_at(lib.bpf_function_start(module, name), lib.bpf_function_size(module, name))
    return FunctionSpec(name=name, insns=insns, relocations=relocations(insns, table_of_fd))
