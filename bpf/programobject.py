"""A running BPF program made from its compiled description (bpf/compiled.py), with the part of BCC's
``BPF`` object's interface optrace's code uses, so that code reads the same whether the program was
compiled in this run or stored: ``program[b"table"]`` (bpf/tables.py), ``load_func``, the attach and detach
calls, ``tracepoint_fds``, ``perf_buffers`` and ``cleanup``.

The maps are created at once (or adopted: those BCC's compile made in this run), each function is loaded
when first asked for, its map references set to this process's map fds; as BCC does, the functions named
``raw_tracepoint__NAME`` and ``tracepoint__CATEGORY__NAME`` are loaded and attached at once.
Nothing here imports BCC (see bpf/bcclib.py).
"""
from __future__ import annotations

import ctypes as ct
import json
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from optrace.bpf import bpfsyscall
from optrace.bpf.abi import ProgType, online_cpus
from optrace.bpf.bcclib import lib
from optrace.bpf.compiled import CompiledProgram, TableSpec, relocated
from optrace.bpf.tables import PerfEventArrayTable, Table, table_class
from optrace.bpf.typedesc import decode_type

RAW_TRACEPOINT_PREFIX = b"raw_tracepoint__"
TRACEPOINT_PREFIX = b"tracepoint__"


@dataclass(frozen=True)
class Function:
    """A loaded function (BCC's ``BPF.Function``)."""

    bpf: object
    name: bytes
    fd: int


class ProgramObject:
    """See the module docstring. ``map_fds``: maps already made for this program (by the compile), in
    the order of its tables, taken over (closed by :meth:`cleanup`)."""

    def __init__(self, compiled: CompiledProgram, map_fds: Sequence[int] | None = None) -> None:
        self.compiled = compiled
        self.funcs: dict[bytes, Function] = {}
        self.tables: dict[bytes, Table] = {}
        self.tracepoint_fds: dict[bytes, int] = {}
        self.raw_tracepoint_fds: dict[bytes, int] = {}
        self.open_perf_events: dict[tuple[int, int], dict[int, int]] = {}
        self.perf_buffers: dict[tuple[int, int], int] = {}
        self._ringbuf_manager: int | None = None
        self._loading: dict[bytes, Future[Function]] = {}  # functions being loaded on threads (preload)
        self._map_fds: list[int] = list(map_fds) if map_fds is not None else []
        try:
            if map_fds is None:
                for table in compiled.tables:
                    self._map_fds.append(bpfsyscall.create_map(table.map_type, table.name, table.key_size,
                                                               table.value_size, table.max_entries, table.flags))
            self._autoload()
        except BaseException:
            self.cleanup()
            raise

    # -- tables ------------------------------------------------------------------------------------------
    def __getitem__(self, name: bytes) -> Table:
        table = self.tables.get(name)
        if table is None:
            index = self.compiled.table_index(name)
            if index is None:
                raise KeyError(name)
            table = self.tables[name] = self._table(self.compiled.tables[index], self._map_fds[index])
        return table

    def __contains__(self, name: bytes) -> bool:
        return self.compiled.table_index(name) is not None

    def _table(self, spec: TableSpec, fd: int) -> Table:
        key = decode_type(json.loads(spec.key_desc))
        leaf = decode_type(json.loads(spec.leaf_desc))
        return table_class(spec.map_type)(self, spec.name, fd, spec.map_type, key, leaf, spec.max_entries,
                                          spec.flags, list(spec.event_fields))

    def get_table(self, name: bytes) -> Table:
        return self[name]

    # -- functions ---------------------------------------------------------------------------------------
    def preload(self, func_name: bytes, prog_type: int, attach_type: int = -1) -> None:
        """Start loading the function on a thread of its own: the kernel verifies it (the sampler: 17 ms
        here) while the caller goes on (the syscall releases the interpreter); :meth:`load_func` takes the
        result, or the error."""
        if func_name in self.funcs or func_name in self._loading:
            return
        loading: Future[Function] = Future()
        self._loading[func_name] = loading

        def load() -> None:
            try:
                loading.set_result(self._load(func_name, prog_type, attach_type))
            except BaseException as exc:  # handed to load_func's caller
                loading.set_exception(exc)

        threading.Thread(target=load, name="optrace-verify", daemon=True).start()

    def load_func(self, func_name: bytes, prog_type: int, device=None, attach_type: int = -1) -> Function:
        """The function loaded as ``prog_type`` (once: a second call returns the first load, as BCC's)."""
        if func_name in self.funcs:
            return self.funcs[func_name]
        loading = self._loading.pop(func_name, None)
        loaded = loading.result() if loading is not None else self._load(func_name, prog_type, attach_type)
        self.funcs[func_name] = loaded
        return loaded

    def load_func_copy(self, alias: bytes, func_name: bytes, prog_type: int, maps: Mapping[bytes, bytes]) -> Function:
        """The function loaded once more, as ``prog_type`` (kept as ``alias``), its references to each map
        named in ``maps`` set to the map named for it instead: a program of another type needs program
        arrays of its own (the kernel ties a program array to the type of the programs that use it), and
        state of its own."""
        if alias not in self.funcs:
            fds = list(self._map_fds)
            for old, new in maps.items():
                found, replacement = self.compiled.table_index(old), self.compiled.table_index(new)
                if found is None or replacement is None:
                    raise Exception(f"Unknown table {old!r} or {new!r}")
                fds[found] = self._map_fds[replacement]
            self.funcs[alias] = self._load(func_name, prog_type, -1, fds)
        return self.funcs[alias]

    def _load(self, func_name: bytes, prog_type: int, attach_type: int, map_fds: list[int] | None = None) -> Function:
        function = self.compiled.function(func_name)
        if function is None:
            raise Exception(f"Unknown program {func_name!r}")
        try:
            fd = bpfsyscall.load_program(prog_type, func_name, relocated(function, map_fds or self._map_fds),
                                         self.compiled.license, self.compiled.kern_version,
                                         attach_type if attach_type >= 0 else 0)
        except OSError as exc:
            raise Exception(f"Failed to load BPF program {func_name!r}: {exc.strerror}") from exc
        return Function(self, func_name, fd)

    def dump_func(self, func_name: bytes) -> bytes:
        """The function's instructions as they are loaded (map references set)."""
        function = self.compiled.function(func_name)
        if function is None:
            raise Exception(f"Unknown program {func_name!r}")
        return relocated(function, self._map_fds)

    def _autoload(self) -> None:
        for function in self.compiled.functions:
            if function.name.startswith(RAW_TRACEPOINT_PREFIX):
                self.attach_raw_tracepoint(function.name[len(RAW_TRACEPOINT_PREFIX):], function.name)
            elif function.name.startswith(TRACEPOINT_PREFIX):
                tracepoint = function.name[len(TRACEPOINT_PREFIX):].replace(b"__", b":", 1)
                self.attach_tracepoint(tracepoint, function.name)

    # -- attaching ---------------------------------------------------------------------------------------
    def attach_raw_tracepoint(self, tp: bytes = b"", fn_name: bytes = b"") -> "ProgramObject":
        if tp in self.raw_tracepoint_fds:
            raise Exception(f"Raw tracepoint {tp!r} has been attached")
        fd = lib.bpf_attach_raw_tracepoint(self.load_func(fn_name, ProgType.RAW_TRACEPOINT).fd, tp)
        if fd < 0:
            raise Exception(f"Failed to attach BPF to raw tracepoint {tp!r}: {os.strerror(ct.get_errno())}")
        self.raw_tracepoint_fds[tp] = fd
        return self

    def detach_raw_tracepoint(self, tp: bytes = b"") -> None:
        if tp not in self.raw_tracepoint_fds:
            raise Exception(f"Raw tracepoint {tp!r} is not attached")
        os.close(self.raw_tracepoint_fds.pop(tp))

    def attach_tracepoint(self, tp: bytes = b"", fn_name: bytes = b"") -> "ProgramObject":
        category, _, name = tp.partition(b":")
        fd = lib.bpf_attach_tracepoint(self.load_func(fn_name, ProgType.TRACEPOINT).fd, category, name)
        if fd < 0:
            raise Exception(f"Failed to attach BPF program {fn_name!r} to tracepoint {tp!r}")
        self.tracepoint_fds[tp] = fd
        return self

    def detach_tracepoint(self, tp: bytes = b"") -> None:
        """Closing the event waits for RCU grace periods in the kernel (see Profiler.close)."""
        fd = self.tracepoint_fds.pop(tp, None)
        if fd is None:
            raise Exception(f"Tracepoint {tp!r} is not attached")
        lib.bpf_close_perf_event_fd(fd)

    def attach_perf_event(self, ev_type: int = -1, ev_config: int = -1, fn_name: bytes = b"", sample_period: int = 0,
                          sample_freq: int = 0, pid: int = -1, cpu: int = -1, group_fd: int = -1) -> None:
        """An event per online CPU (or on ``cpu``) running the function."""
        prog_fd = self.load_func(fn_name, ProgType.PERF_EVENT).fd
        opened: dict[int, int] = {}
        try:
            for each in [cpu] if cpu >= 0 else online_cpus():
                fd = lib.bpf_attach_perf_event(prog_fd, ev_type, ev_config, sample_period, sample_freq, pid, each,
                                               group_fd)
                if fd < 0:
                    raise Exception("Failed to attach BPF to perf event")
                opened[each] = fd
        except BaseException:
            for fd in opened.values():
                lib.bpf_close_perf_event_fd(fd)
            raise
        self.open_perf_events[(ev_type, ev_config)] = opened

    def detach_perf_event(self, ev_type: int = -1, ev_config: int = -1) -> None:
        fds = self.open_perf_events.pop((ev_type, ev_config), None)
        if fds is None:
            raise Exception("Perf event type {} config {} not attached".format(ev_type, ev_config))
        for fd in fds.values():
            lib.bpf_close_perf_event_fd(fd)

    # -- outputs -----------------------------------------------------------------------------------------
    def perf_buffer_poll(self, timeout: int = -1) -> None:
        readers = (ct.c_void_p * len(self.perf_buffers))(*self.perf_buffers.values())
        lib.perf_reader_poll(len(readers), readers, timeout)

    def perf_buffer_consume(self) -> None:
        readers = (ct.c_void_p * len(self.perf_buffers))(*self.perf_buffers.values())
        lib.perf_reader_consume(len(readers), readers)

    def open_ring_buffer_fd(self, map_fd: int, callback, ctx=None) -> None:
        if self._ringbuf_manager is None:
            self._ringbuf_manager = lib.bpf_new_ringbuf(map_fd, callback, ctx)
            if not self._ringbuf_manager:
                self._ringbuf_manager = None
                raise Exception("Could not open ring buffer")
        elif lib.bpf_add_ringbuf(self._ringbuf_manager, map_fd, callback, ctx) < 0:
            raise Exception("Could not open ring buffer")

    def ring_buffer_poll(self, timeout: int = -1) -> None:
        if self._ringbuf_manager is None:
            raise Exception("No ring buffers to poll")
        lib.bpf_poll_ringbuf(self._ringbuf_manager, timeout)

    def ring_buffer_consume(self) -> None:
        if self._ringbuf_manager is None:
            raise Exception("No ring buffers to poll")
        lib.bpf_consume_ringbuf(self._ringbuf_manager)

    # -- the end -----------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Detach and close everything (safe to call twice): events, links, buffers, programs, maps."""
        for tp in list(self.tracepoint_fds):
            self.detach_tracepoint(tp)
        for tp in list(self.raw_tracepoint_fds):
            self.detach_raw_tracepoint(tp)
        for key in list(self.open_perf_events):
            self.detach_perf_event(*key)
        for table in self.tables.values():
            if isinstance(table, PerfEventArrayTable):
                table.close_buffers()
        if self._ringbuf_manager is not None:
            lib.bpf_free_ringbuf(self._ringbuf_manager)
            self._ringbuf_manager = None
        for name in list(self._loading):  # their loads end (and their fds are closed) before the maps go
            try:
                self.load_func(name, 0)
            except Exception:
                pass
        for function in self.funcs.values():
            os.close(function.fd)
        self.funcs.clear()
        for fd in self._map_fds:
            os.close(fd)
        self._map_fds = []
        self.tables.clear()

    close = cleanup

    def __enter__(self) -> "ProgramObject":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()
