"""The replay harness: the sampler's own BPF C (the sources and options bpf/profiler.py loads with the CFI and
Python walkers) compiled by the host compiler against shim/replay_shim.h and driven here, so a stored
snapshot of a process is walked by the very rules the kernel runs (the OpenTelemetry eBPF profiler's
coredump tests do the same for theirs).

A replay is one perf event: :meth:`Replay.sample` runs ``on_sample`` on the snapshot's registers, with the
maps filled as user space fills them in a recording (the process's mapping table and unwind rows, its
interpreter for python.c); the stack comes back from the stack store (stackstore.c) as user space reads it,
with python.c's captures of code objects.

Only what the host compiler cannot take is changed in the program's text (:data:`HOST_REWRITES`); a rewrite
that no longer matches fails the build rather than silently compiling something else.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import struct
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from optrace.bpf.loader import program_text
from optrace.bpf.profiler import COUNT_KEY, Profiler
from optrace.bpf.pythonmaps import packed_process
from optrace.bpf.stackstore import CHUNK_BYTES, parse_records, stored
from optrace.bpf.unwindmaps import PROG_UNWIND_STEP, PYTHON_PROGRAMS, ROW_SIZE
from optrace.pythonlayout import CAPTURE_SIZE, PythonProcess

SHIM = Path(__file__).with_name("shim")
REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "replay"
PID, TID = 4242, 4242  # the replayed process as the programs see it
EPOCH = 1_000_000  # its mappings' epoch (profile.c), the same in its table: the table is current
# (pattern, replacement, why): BPF assembly the x86 assembler cannot take, as the C it stands for
HOST_REWRITES = (
    (r'asm volatile\("%0 &= 511" : "\+r"\((\w+)\)\);', r"\1 &= 511;",
     "stackstore.c masks a length in BPF assembly (kept from clang); the same mask in C"),
)
_MAPPING = struct.Struct("<QQQQIIII")  # struct unwind_mapping (unwind.c), as unwindmaps.py packs it
_PROC_HEAD = struct.Struct("<IIQ")  # struct unwind_proc: count, pad, epoch
_READ_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p)


@dataclass(frozen=True)
class ReplayMapping:
    """One executable mapping as unwind.c's table holds it; ``rows`` (ROW_SIZE bytes each, sorted by pc)."""

    start: int
    end: int
    file_offset: int
    bias: int
    file_id: int  # 0: its frames stay raw IPs
    rows: bytes


@dataclass(frozen=True)
class ReplayResult:
    words: tuple[int, ...]  # the stored stack's frame words, leaf first
    status: int  # enum unwind_status
    python_status: int  # enum python_status
    captures: tuple[bytes, ...]  # python.c's captures (CAPTURE_SIZE bytes each)
    tail_calls: int
    rows_looked_up: tuple[int, ...]  # indices of unwind_rows the walk read


def host_text(text: str) -> str:
    """The program's text with HOST_REWRITES applied; raises when one no longer matches."""
    for pattern, replacement, why in HOST_REWRITES:
        text, count = re.subn(pattern, replacement, text)
        if not count:
            raise AssertionError(f"replay rewrite no longer matches ({why}): update tests/replay/replay.py")
    left = re.findall(r'asm volatile\("[^"]+"', text)
    if left:
        raise AssertionError(f"BPF assembly the host cannot compile: {left}")
    return text


def program_profile() -> Profiler:
    """The sampler as record configures it for CFI and Python walks (nothing loaded: its sources and options)."""
    return Profiler(pids=[PID], cfi_unwind=True, python=True)


def build(compiler: str = "gcc") -> Path:
    """The shared library of the replay (built once per text and options, under build/replay)."""
    profile = program_profile()
    text = (SHIM / "replay_shim.h").read_text() + host_text(program_text(profile._sources()).decode())
    text += (SHIM / "replay_driver.c").read_text()
    flags = [*profile._cflags, "-O1", "-g", "-fPIC", "-shared", "-fno-strict-aliasing", "-Wno-unknown-pragmas",
             "-Wno-unused-function", "-Wno-unused-variable", f"-I{SHIM / 'include'}"]
    digest = hashlib.sha256("\0".join([text, compiler, *flags]).encode()).hexdigest()[:16]
    BUILD.mkdir(parents=True, exist_ok=True)
    library = BUILD / f"replay-{digest}.so"
    if not library.exists():
        source = BUILD / f"replay-{digest}.{os.getpid()}.c"  # two test runs may build at once
        source.write_text(text)
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run([compiler, *flags, "-o", str(partial), str(source)], capture_output=True, text=True)
        if done.returncode:
            raise AssertionError(f"the replay does not compile:\n{done.stderr[-4000:]}")
        partial.rename(library)
        source.rename(BUILD / f"replay-{digest}.c")
    return library


class Replay:
    """One loaded replay library: the maps of one sampler, one process at a time."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)
        self._reader = None  # keeps the live reader's callback alive
        lib = self._lib
        lib.replay_output_take.restype = ctypes.c_long
        lib.replay_set_current.argtypes = (ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char_p,
                                           ctypes.c_uint64)
        lib.replay_sample.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)
        lib.replay_add_region.argtypes = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p)
        lib.replay_prog_set.argtypes = (ctypes.c_char_p, ctypes.c_uint32, ctypes.c_void_p)
        self._install_programs()

    def reset(self) -> None:
        """Every map empty again (the programs stay in place), no memory."""
        self._lib.replay_reset()
        self._lib.replay_clear_regions()

    def _install_programs(self) -> None:
        """The walk's programs in unwind_progs, as UnwindMaps.load_step puts them."""
        for index, name in [(PROG_UNWIND_STEP, b"unwind_step"), *PYTHON_PROGRAMS]:
            address = ctypes.cast(getattr(self._lib, name.decode()), ctypes.c_void_p).value
            if self._lib.replay_prog_set(b"unwind_progs", index, address):
                raise AssertionError(f"cannot put {name!r} in unwind_progs")

    def sizes(self, name: str) -> tuple[int, int, int]:
        key, value, entries = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32()
        if self._lib.replay_map_sizes(name.encode(), ctypes.byref(key), ctypes.byref(value), ctypes.byref(entries)):
            raise KeyError(name)
        return key.value, value.value, entries.value

    def update(self, name: str, key: bytes, value: bytes) -> None:
        key_size, value_size, _ = self.sizes(name)
        if (len(key), len(value)) != (key_size, value_size):
            raise AssertionError(f"{name}: {len(key)}/{len(value)} bytes given, the program's are {key_size}/{value_size}")
        if self._lib.replay_map_update(name.encode(), key, value):
            raise AssertionError(f"{name}: update refused")

    def entries(self, name: str) -> list[tuple[bytes, bytes]]:
        key_size, value_size, _ = self.sizes(name)
        room = 4096
        keys, values = ctypes.create_string_buffer(key_size * room), ctypes.create_string_buffer(value_size * room)
        n = self._lib.replay_map_entries(name.encode(), keys, values, room)
        return [(keys.raw[i * key_size:(i + 1) * key_size], values.raw[i * value_size:(i + 1) * value_size])
                for i in range(max(n, 0))]

    def load_process(self, mappings: Sequence[ReplayMapping], python: PythonProcess | None) -> None:
        """The process's mapping table and rows (unwindmaps.py's packing), and its interpreter (pythonmaps.py's)."""
        rows, packed, at = b"", b"", 0
        for m in sorted(mappings, key=lambda m: m.start):
            count = len(m.rows) // ROW_SIZE
            offset_adj = (m.file_offset - m.start) & ((1 << 64) - 1)
            packed += _MAPPING.pack(m.start, m.end, m.bias & ((1 << 64) - 1), offset_adj, at, count, m.file_id, 0)
            rows += m.rows
            at += count
        self._write_rows(rows)
        _, proc_size, _ = self.sizes("unwind_procs")
        value = _PROC_HEAD.pack(len(mappings), 0, EPOCH) + packed
        self.update("unwind_procs", struct.pack("<I", PID), value.ljust(proc_size, b"\0"))
        self.update("epochs", struct.pack("<I", PID), struct.pack("<Q", EPOCH))
        if python is not None:
            self.update("py_procs", struct.pack("<I", PID), packed_process(python, 1))

    def _write_rows(self, rows: bytes) -> None:
        for index in range(len(rows) // ROW_SIZE):
            self.update("unwind_rows", struct.pack("<I", index), rows[index * ROW_SIZE:(index + 1) * ROW_SIZE])

    def set_memory(self, regions: Sequence[tuple[int, bytes]]) -> None:
        self._lib.replay_clear_regions()
        for start, data in regions:
            if self._lib.replay_add_region(start, len(data), data):
                raise AssertionError("too many memory regions")

    def set_reader(self, read: Callable[[int, int], bytes | None] | None) -> None:
        """Reads of process memory from ``read(address, size)`` (bytes, or None: unreadable) instead of regions."""
        if read is None:
            self._reader = None
            self._lib.replay_set_reader(None)
            return

        def reader(address: int, size: int, into: int) -> int:
            data = read(address, size)
            if data is None or len(data) != size:
                return -1
            ctypes.memmove(into, data, size)
            return 0

        self._reader = _READ_FN(reader)
        self._lib.replay_set_reader(self._reader)

    def reads(self) -> list[tuple[int, int]]:
        """The reads of process memory since the last call (address, size)."""
        room = 65536
        addresses, sizes = (ctypes.c_uint64 * room)(), (ctypes.c_uint32 * room)()
        n = self._lib.replay_reads(addresses, sizes, room)
        return list(zip(addresses[:n], sizes[:n]))

    def sample(self, ip: int, sp: int, bp: int, fs_base: int, comm: str = "replay", now_ns: int = 10**12
               ) -> ReplayResult:
        """One sample of the thread at these registers, walked and stored as the kernel would."""
        if self._lib.replay_set_current(PID, TID, fs_base, comm.encode(), now_ns):
            raise AssertionError("cannot set the sampled thread")
        self._lib.replay_array_log(b"unwind_rows", 1)
        self._lib.replay_output_take(b"py_captures", None, 0)
        tail_calls = self._lib.replay_sample(ctypes.cast(self._lib.on_sample, ctypes.c_void_p).value, ip, sp, bp)
        looked = (ctypes.c_uint32 * 4096)()
        n = self._lib.replay_array_logged(b"unwind_rows", looked, 4096)
        words, status, python_status = self._stored_stack()
        return ReplayResult(words, status, python_status, self._captures(), tail_calls, tuple(looked[:max(n, 0)]))

    def _stored_stack(self) -> tuple[tuple[int, ...], int, int]:
        """The sample's user stack as user space reads it: the count key's hash, its record in the store."""
        keys = [COUNT_KEY.unpack(key) for name in ("counts0", "rawcounts0") for key, _ in self.entries(name)]
        hashes = {key[2] for key in keys if key[0] == PID and key[2]}
        if len(hashes) != 1:
            raise AssertionError(f"the sample was counted under {len(hashes)} user stacks: {keys}")
        stack_hash = hashes.pop()
        _, chunk_size, chunks = self.sizes("store_arena")
        records: dict[int, bytes] = {}
        data = ctypes.create_string_buffer(chunk_size)
        for index in range(chunks // 2):  # the first half: epoch 0 writes it
            self._lib.replay_array_read(b"store_arena", index, 1, data)
            parse_records(data.raw[:CHUNK_BYTES], 0, records)
            if stack_hash in records:
                break
        if stack_hash not in records:
            raise AssertionError("the sample's stack is not in the stack store")
        record = stored(records[stack_hash])
        return tuple(struct.unpack(f"<{len(record.words) // 8}Q", record.words)), record.status, record.python

    def _captures(self) -> tuple[bytes, ...]:
        room = 1 << 22
        buffer = ctypes.create_string_buffer(room)
        got = self._lib.replay_output_take(b"py_captures", buffer, room)
        captures, at = [], 0
        while 0 <= at < got:
            size = struct.unpack_from("<I", buffer.raw, at)[0]
            captures.append(buffer.raw[at + 4:at + 4 + size][:CAPTURE_SIZE])
            at += 4 + size
        return tuple(captures)

