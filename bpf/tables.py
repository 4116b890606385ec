"""A loaded program's maps as BCC's Python shows them (bcc/table.py, 0.26): ``table[key]``, ``table[key] =
leaf``, ``del table[key]``, ``keys()``, ``items()``, ``values()``, the batch reads, ``Key``/``Leaf`` ctypes
types, ``map_fd`` and ``max_entries``; per-CPU values as one slot per possible CPU; a perf output's
``open_perf_buffer``/``event`` and a ring buffer's ``open_ring_buffer``. The subset optrace's code calls,
over BCC's primitives (bpf/bcclib.py), so it reads the same whether its program was compiled in this run
or stored (bpf/programobject.py).
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from optrace.bpf.abi import MapType, online_cpus, possible_cpus
from optrace.bpf.bcclib import LOST_CB_TYPE, RAW_CB_TYPE, RINGBUF_CB_TYPE, PerfBufferOpts, lib
from optrace.bpf.typedesc import event_type


class Table(MutableMapping):
    """A hash map (and the base of the others); ``owner``: the program object (perf buffers, ring buffers)."""

    def __init__(self, owner, name: bytes, map_fd: int, map_type: int, key: type, leaf: type, max_entries: int,
                 flags: int, event_fields: list[str] | None = None) -> None:
        self.bpf = owner
        self.name = name
        self.map_fd = map_fd
        self.ttype = map_type
        self.Key = key
        self.Leaf = leaf
        self.max_entries = max_entries
        self.flags = flags
        self._event_fields = event_fields or []
        self._event_class: type | None = None
        self._cbs: dict[int, Any] = {}

    def get_fd(self) -> int:
        return self.map_fd

    def __getitem__(self, key):
        leaf = self.Leaf()
        if lib.bpf_lookup_elem(self.map_fd, ct.byref(key), ct.byref(leaf)) < 0:
            raise KeyError(key)
        return leaf

    def __setitem__(self, key, leaf) -> None:
        if lib.bpf_update_elem(self.map_fd, ct.byref(key), ct.byref(leaf), 0) < 0:
            raise Exception(f"Could not update table: {os.strerror(ct.get_errno())}")

    def __delitem__(self, key) -> None:
        if lib.bpf_delete_elem(self.map_fd, ct.byref(key)) < 0:
            raise KeyError(key)

    def __iter__(self) -> Iterator:
        key = None
        while True:
            following = self.Key()
            if key is None:
                found = lib.bpf_get_first_key(self.map_fd, ct.byref(following), ct.sizeof(self.Key))
            else:
                found = lib.bpf_get_next_key(self.map_fd, ct.byref(key), ct.byref(following))
            if found < 0:
                return
            key = following
            yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys(self) -> Iterator:
        return iter(self)

    def items(self) -> list[tuple]:
        """Every (key, leaf); an entry deleted between the listing and its lookup is left out."""
        found = []
        for key in self:
            try:
                found.append((key, self[key]))
            except KeyError:
                pass
        return found

    def values(self) -> list:
        return [leaf for _, leaf in self.items()]

    def clear(self) -> None:
        for key in list(self.keys()):
            try:
                del self[key]
            except KeyError:
                pass

    def items_lookup_batch(self) -> Iterator[tuple]:
        return self._batch(lib.bpf_lookup_batch, "BPF_MAP_LOOKUP_BATCH")

    def items_lookup_and_delete_batch(self) -> Iterator[tuple]:
        return self._batch(lib.bpf_lookup_and_delete_batch, "BPF_MAP_LOOKUP_AND_DELETE_BATCH")

    def _batch(self, call: Callable, command: str) -> Iterator[tuple]:
        """Up to max_entries entries in as few calls as the kernel takes; as BCC, a scalar key or value
        comes as a Python int (an element of a ctypes array of it)."""
        keys, values = (self.Key * self.max_entries)(), (self.Leaf * self.max_entries)()
        token, count = ct.c_uint32(0), ct.c_uint32(0)
        total = 0
        while total < self.max_entries:
            count.value = self.max_entries - total
            failed = call(self.map_fd, ct.byref(token) if total else None, ct.byref(token),
                          ct.byref(keys, ct.sizeof(self.Key) * total), ct.byref(values, ct.sizeof(self.Leaf) * total),
                          ct.byref(count))
            error = ct.get_errno()
            total += count.value
            if failed:
                if error != errno.ENOENT:
                    raise Exception(f"{command} has failed: {os.strerror(error)}")
                break
            if not count.value:
                break
        for index in range(total):
            yield keys[index], values[index]

    def event(self, data):
        """The output's event struct at ``data`` (the types BCC's compiler saw passed to perf_submit)."""
        if self._event_class is None:
            self._event_class = event_type(self._event_fields)
        return ct.cast(data, ct.POINTER(self._event_class)).contents


class ArrayTable(Table):
    """Every index exists; ``del`` zeroes it. Integer keys are taken too."""

    def _index(self, key):
        if isinstance(key, int):
            key = self.Key(key + self.max_entries if key < 0 else key)
        if not isinstance(key, ct._SimpleCData) or not 0 <= key.value < self.max_entries:
            raise IndexError("Array index out of range")
        return key

    def __getitem__(self, key):
        return super().__getitem__(self._index(key))

    def __setitem__(self, key, leaf) -> None:
        super().__setitem__(self._index(key), leaf)

    def __delitem__(self, key) -> None:
        super().__setitem__(self._index(key), self.Leaf())

    def __iter__(self) -> Iterator:
        return (self.Key(index) for index in range(self.max_entries))

    def __len__(self) -> int:
        return self.max_entries


class ProgArrayTable(ArrayTable):
    """Tail-call slots: a program's fd (or its Function) goes in."""

    def __setitem__(self, key, leaf) -> None:
        if isinstance(leaf, int):
            leaf = self.Leaf(leaf)
        elif hasattr(leaf, "fd") and not isinstance(leaf, ct._SimpleCData):
            leaf = self.Leaf(leaf.fd)
        super().__setitem__(key, leaf)


class PerCpuMixin:
    """A value per possible CPU: ``Leaf`` is an array of them (8-byte slots, as the kernel copies them)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sLeaf = self.Leaf
        self.total_cpu = len(possible_cpus())
        if ct.sizeof(self.sLeaf) % 8 == 0:
            self.Leaf = self.sLeaf * self.total_cpu
        elif self.sLeaf in (ct.c_uint, ct.c_int):
            self.Leaf = (ct.c_uint64 if self.sLeaf == ct.c_uint else ct.c_int64) * self.total_cpu
        else:
            raise IndexError("Leaf must be aligned to 8 bytes")

    def __getitem__(self, key):
        raw = super().__getitem__(key)
        if ct.sizeof(self.sLeaf) % 8 == 0:
            return raw
        values = (self.sLeaf * self.total_cpu)()
        for cpu in range(self.total_cpu):
            values[cpu] = raw[cpu]
        return values


class PerCpuArrayTable(PerCpuMixin, ArrayTable):
    pass


class PerCpuHashTable(PerCpuMixin, Table):
    pass


class PerfEventArrayTable(ArrayTable):
    """A perf output: a perf buffer per online CPU, whose reader the program object keeps in
    ``perf_buffers`` (BCC's layout: key (id(table), cpu))."""

    def open_perf_buffer(self, callback: Callable, page_cnt: int = 8, lost_cb: Callable | None = None,
                         wakeup_events: int = 1) -> None:
        if page_cnt & (page_cnt - 1):
            raise Exception("Perf buffer page_cnt must be a power of two")
        for cpu in online_cpus():
            self._open_perf_buffer(cpu, callback, page_cnt, lost_cb, wakeup_events)

    def _open_perf_buffer(self, cpu: int, callback: Callable, page_cnt: int, lost_cb: Callable | None,
                          wakeup_events: int) -> None:
        raw = RAW_CB_TYPE(lambda _, data, size: callback(cpu, data, size))
        lost = LOST_CB_TYPE(lambda _, count: lost_cb(count)) if lost_cb else ct.cast(None, LOST_CB_TYPE)
        opts = PerfBufferOpts(pid=-1, cpu=cpu, wakeup_events=wakeup_events)
        reader = lib.bpf_open_perf_buffer_opts(raw, lost, None, page_cnt, ct.byref(opts))
        if not reader:
            raise Exception("Could not open perf buffer")
        self[self.Key(cpu)] = self.Leaf(lib.perf_reader_fd(reader))
        self.bpf.perf_buffers[(id(self), cpu)] = reader
        self._cbs[cpu] = (raw, lost)

    def close_buffers(self) -> None:
        """Free this output's readers (their mappings and fds)."""
        for cpu in list(self._cbs):
            reader = self.bpf.perf_buffers.pop((id(self), cpu), None)
            if reader:
                lib.perf_reader_free(reader)
            del self._cbs[cpu]


class RingBufTable(Table):
    """A ring buffer output, read through the program object's ring buffer manager."""

    def __len__(self) -> int:
        return 0

    def open_ring_buffer(self, callback: Callable, ctx=None) -> None:
        def call(context, data, size) -> int:
            result = callback(context, data, size)
            return result if isinstance(result, int) else 0

        function = RINGBUF_CB_TYPE(call)
        self.bpf.open_ring_buffer_fd(self.map_fd, function, ctx)
        self._cbs[0] = function


TABLE_CLASSES: dict[int, type[Table]] = {
    MapType.HASH: Table,
    MapType.LRU_HASH: Table,
    MapType.STACK_TRACE: Table,
    MapType.ARRAY: ArrayTable,
    MapType.PROG_ARRAY: ProgArrayTable,
    MapType.PERCPU_ARRAY: PerCpuArrayTable,
    MapType.PERCPU_HASH: PerCpuHashTable,
    MapType.LRU_PERCPU_HASH: PerCpuHashTable,
    MapType.PERF_EVENT_ARRAY: PerfEventArrayTable,
    MapType.RINGBUF: RingBufTable,
}


def table_class(map_type: int) -> type[Table]:
    """Another map type is a plain table (element operations only), as its BCC class would mostly be."""
    return TABLE_CLASSES.get(map_type, Table)
