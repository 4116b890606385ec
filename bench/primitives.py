"""Helper of bench_startup.py (run in its own process, with optrace importable): a stored program's maps
created and functions loaded through each of three primitives, interleaved; prints JSON.

  bcc:    libbcc_bpf.so's bcc_create_map and bcc_prog_load (BCC's own, without its compiler)
  libbpf: Debian's libbpf.so.1 (bpf_map_create, bpf_prog_load)
  bpf(2): the syscall through ctypes (what optrace uses: bpf/bpfsyscall.py)

Each round loads record's sampler (its default options: the CFI and Python walkers) as the program cache holds
it: every map, then on_sample and the walker's programs (unwind_step, python.c's) with the maps' fds put into
their instructions; then closes everything. The sources and options are the Profiler's own (bpf/profiler.py),
the walker's programs unwindmaps.py's list. The library's own load (dlopen, in a fresh process) is measured
apart. Usage: primitives.py ROUNDS
"""
from __future__ import annotations

import ctypes as ct
import json
import os
import random
import statistics
import subprocess
import sys
import time

from optrace.bpf import bpfsyscall
from optrace.bpf.abi import ProgType
from optrace.bpf.compiled import relocated
from optrace.bpf.loader import load_bcc, program_loads
from optrace.bpf.profiler import Profiler
from optrace.bpf.unwindmaps import PYTHON_PROGRAMS

SAMPLER = Profiler(pids=[], cfi_unwind=True, python=True)  # record -p PID's, as session.py makes it
FUNCTIONS = tuple((name, ProgType.PERF_EVENT) for name in (b"on_sample", b"unwind_step",
                                                           *(name for _, name in PYTHON_PROGRAMS)))
LIBRARIES = {"bcc": "libbcc_bpf.so.0", "libbpf": "libbpf.so.1", "bpf(2)": None, "libbcc.so (BCC with LLVM)": "libbcc.so.0"}


class MapCreateOpts(ct.Structure):
    """libbpf 1.1's struct bpf_map_create_opts."""

    _fields_ = [("sz", ct.c_size_t), ("btf_fd", ct.c_uint32), ("btf_key_type_id", ct.c_uint32),
                ("btf_value_type_id", ct.c_uint32), ("btf_vmlinux_value_type_id", ct.c_uint32),
                ("inner_map_fd", ct.c_uint32), ("map_flags", ct.c_uint32), ("map_extra", ct.c_uint64),
                ("numa_node", ct.c_uint32), ("map_ifindex", ct.c_uint32)]


def stored_sampler():
    """record's sampler as the program cache holds it (loaded once through optrace, as Profiler.load does)."""
    running = load_bcc(SAMPLER._sources(), SAMPLER._cflags)
    running.cleanup()
    if program_loads()[-1].compiled:
        raise SystemExit("the sampler was not stored: run it again")
    return running.compiled


def with_syscall(program) -> list[int]:
    fds = [bpfsyscall.create_map(t.map_type, t.name, t.key_size, t.value_size, t.max_entries, t.flags)
           for t in program.tables]
    for name, prog_type in FUNCTIONS:
        fds.append(bpfsyscall.load_program(prog_type, name, relocated(program.function(name), fds), program.license,
                                           program.kern_version))
    return fds


def with_bcc(program, lib) -> list[int]:
    fds = [lib.bcc_create_map(t.map_type, t.name, t.key_size, t.value_size, t.max_entries, t.flags)
           for t in program.tables]
    for name, prog_type in FUNCTIONS:
        insns = relocated(program.function(name), fds)
        fds.append(lib.bcc_prog_load(prog_type, name, insns, len(insns), program.license, program.kern_version, 0,
                                     None, 0))
    return fds


def with_libbpf(program, lib) -> list[int]:
    fds = []
    for t in program.tables:
        opts = MapCreateOpts(sz=ct.sizeof(MapCreateOpts), map_flags=t.flags)
        fds.append(lib.bpf_map_create(t.map_type, t.name, t.key_size, t.value_size, t.max_entries, ct.byref(opts)))
    for name, prog_type in FUNCTIONS:
        insns = relocated(program.function(name), fds)
        fds.append(lib.bpf_prog_load(prog_type, name, program.license, insns, len(insns) // 8, None))
    return fds


def declared(path: str) -> ct.CDLL:
    lib = ct.CDLL(path, use_errno=True)
    if path.startswith("libbcc_bpf"):
        lib.bcc_create_map.argtypes = [ct.c_int, ct.c_char_p, ct.c_int, ct.c_int, ct.c_int, ct.c_int]
        lib.bcc_prog_load.argtypes = [ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_int, ct.c_char_p, ct.c_uint, ct.c_int,
                                      ct.c_char_p, ct.c_uint]
    else:
        lib.bpf_map_create.argtypes = [ct.c_int, ct.c_char_p, ct.c_uint32, ct.c_uint32, ct.c_uint32, ct.c_void_p]
        lib.bpf_prog_load.argtypes = [ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_char_p, ct.c_size_t, ct.c_void_p]
    return lib


def library_load(name: str | None) -> dict:
    """dlopen in a fresh python3: CPU ms and RSS growth (MB)."""
    code = ("import ctypes, time\nrss = lambda: int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0]"
            ".split()[1])\nr, t = rss(), time.process_time()\n"
            + (f"ctypes.CDLL({name!r})\n" if name else "")
            + "print((time.process_time() - t) * 1000, (rss() - r) / 1024)")
    runs = [list(map(float, subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                                            check=True).stdout.split())) for _ in range(5)]
    return {"cpu_ms": statistics.median(r[0] for r in runs), "rss_mb": statistics.median(r[1] for r in runs)}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    program = stored_sampler()
    loaders = {"bcc": lambda: with_bcc(program, bcc), "libbpf": lambda: with_libbpf(program, libbpf),
               "bpf(2)": lambda: with_syscall(program)}
    bcc, libbpf = declared("libbcc_bpf.so.0"), declared("libbpf.so.1")
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    for _ in range(rounds):
        for name in random.sample(list(loaders), len(loaders)):
            wall, cpu = time.perf_counter(), time.process_time()
            fds = loaders[name]()
            times[name].append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000))
            if min(fds) < 0:
                raise SystemExit(f"{name}: a map or program was refused")
            for fd in fds:
                os.close(fd)
    print(json.dumps({
        "load": {name: {"wall_ms": statistics.median(w for w, _ in runs), "cpu_ms": statistics.median(c for _, c in runs),
                        "cpu_ms_range": [min(c for _, c in runs), max(c for _, c in runs)]} for name, runs in times.items()},
        "library": {name: library_load(path) for name, path in LIBRARIES.items()},
        "maps": len(program.tables), "functions": [name.decode() for name, _ in FUNCTIONS], "rounds": rounds}))


if __name__ == "__main__":
    main()
