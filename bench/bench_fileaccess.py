"""Benchmark of reading files for a process with its user's credentials (issue 40): what `record` pays at
its end to keep the hot Python functions' source lines (at most 100 functions, so 100 files) now that each
file is opened by a thread holding the process's credentials (optrace.credentials.run_as, one thread per
set of credentials; a thread per process measured too), next to the two other designs: deciding from the file's mode bits as root (before issue 40: wrong,
it misses the folders on the way) and a child process per process that takes the credentials and reads
(the design the issue offered first; here a `python -I -S` child, which is what optrace would start).

Two shapes: 100 files of one process (one batch), and 1 file of each of 100 processes (100 batches).
Interleaved rounds, median and quartiles of the wall time of the whole capture. Run as root:
`.venv/bin/python bench/bench_fileaccess.py`. Writes bench/results/fileaccess.json.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import md_table, median, provenance, quartiles, write_results  # noqa: E402

from optrace.fileaccess import open_reader  # noqa: E402
from optrace.frontend.runtimes.cpython.sourcecapture import (SOURCE_POLICY, SourceOwner, read_sources,  # noqa: E402
                                                             source_owner)

BENCH_BUDGET_S = 240
ROUNDS = 7
FILES = 100
USER = 64101  # no account needed: the kernel checks numbers
TARGET_S = 0.5  # the whole capture of 100 files, either shape: well under a second at the end of a record
CHILD = """
import os, sys
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([]); os.setresgid(gid, gid, gid); os.setresuid(uid, uid, uid)
for path in sys.argv[3:]:
    try:
        with open(path, "rb") as f:
            f.read(4 << 20)
    except OSError:
        pass
"""


Batch = tuple[int, list[str], SourceOwner]  # a process, the files it names, its owner


def mode_bits(batches: list[Batch]) -> int:
    """Before issue 40: opened as root, kept if the file's own mode bits let the user read it."""
    read = 0
    for _pid, files, owner in batches:
        for file in files:
            with open_reader(file, SOURCE_POLICY) as reader:
                info = os.fstat(reader.fd)
                uid = owner.credentials.uid
                if (info.st_uid == uid and info.st_mode & stat.S_IRUSR) or info.st_mode & stat.S_IROTH:
                    read += len(reader.read().decode("utf-8", "replace").splitlines()) > 0
    return read


def thread_as_user(batches: list[Batch]) -> int:
    """Now: one thread for each set of credentials (all the processes here have the same)."""
    return len(read_sources({pid: files for pid, files, _ in batches}, {pid: owner for pid, _, owner in batches}))


def thread_per_process(batches: list[Batch]) -> int:
    return sum(len(read_sources({pid: files}, {pid: owner})) for pid, files, owner in batches)


def child_as_user(batches: list[Batch]) -> int:
    for _pid, files, owner in batches:
        user = owner.credentials
        subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, str(user.uid), str(user.gid), *files], check=True)
    return sum(len(files) for _, files, _ in batches)


DESIGNS: dict[str, Callable[[list[Batch]], int]] = {
    "a thread per set of credentials (now)": thread_as_user,
    "a thread per process": thread_per_process,
    "mode bits, opened as root (before; wrong)": mode_bits,
    "python -I -S child per process": child_as_user,
}


def capture(design: Callable[[list[Batch]], int], batches: list[Batch]) -> float:
    started = time.perf_counter()
    design(batches)
    return time.perf_counter() - started


def main() -> int:
    if os.geteuid() != 0:
        print("bench_fileaccess needs root (it reads as other users)", file=sys.stderr)
        return 1
    load = Path("/proc/loadavg").read_text().split()[:3]
    base = Path(tempfile.mkdtemp(prefix="optrace-bench-files-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    home = base / "home"
    home.mkdir(mode=0o700)
    os.chown(home, USER, USER)
    files = []
    for n in range(FILES):
        path = home / f"module{n}.py"
        path.write_text("".join(f"def f{n}_{i}(x):\n    return x * {i}\n" for i in range(100)))
        os.chown(path, USER, USER)
        os.chmod(path, 0o600)
        files.append(str(path))
    procs = [subprocess.Popen(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "sleep", "600"])
             for _ in range(FILES)]
    try:
        time.sleep(0.5)
        owners = [(proc.pid, source_owner(proc.pid)) for proc in procs]
        assert all(owner is not None and owner.credentials.uid == USER for _, owner in owners)
        shapes = {"100 files of 1 process": [(owners[0][0], files, owners[0][1])],
                  "1 file of each of 100 processes": [(pid, [file], owner) for (pid, owner), file in zip(owners, files)]}
        for shape, batches in shapes.items():
            assert thread_as_user(batches) == FILES, f"{shape}: the thread did not read every file: proves nothing"
        times: dict[tuple[str, str], list[float]] = {}
        for round_ in range(ROUNDS):
            print(f"round {round_ + 1}/{ROUNDS}", file=sys.stderr, flush=True)
            for shape, batches in shapes.items():
                for name, design in DESIGNS.items():
                    times.setdefault((shape, name), []).append(capture(design, batches))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(base)
    rows, targets = [], []
    for (shape, name), seconds in times.items():
        q = quartiles(seconds)
        rows.append([shape, name, f"{median(seconds) * 1000:.1f}", f"{q[0] * 1000:.1f}-{q[1] * 1000:.1f}",
                     f"{median(seconds) * 1e6 / FILES:.0f}"])
    for shape in shapes:
        now = median(times[shape, next(iter(DESIGNS))])
        targets.append({"name": f"source capture as the process's user, {shape}", "target": f"<= {TARGET_S:g} s",
                        "measured": f"{now * 1000:.1f} ms", "met": now <= TARGET_S})
    write_results("fileaccess", {"seconds": {f"{shape}/{name}": v for (shape, name), v in times.items()},
                                 "targets": targets, "load": load})
    print("## Reading files as the process's user (issue 40)\n")
    print(f"{provenance(sys.argv)}; load average {' '.join(load)} at the start (a shared 2-CPU VM). What the end "
          f"of `record` pays to read {FILES} Python source files (5 KB each, 0600 in the processes' user's 0700 "
          f"folder) for the processes that name them, {ROUNDS} interleaved rounds:\n")
    print(md_table(["shape", "design", "median ms", "IQR ms", "µs a file"], rows))
    print("\n`now` opens each file in a thread that holds the process's uid, gid, groups and no capability "
          "(optrace/credentials.py), one thread for all the processes of the same credentials (here, one); "
          "`a thread per process` is the same without that batching. Each includes reading the processes' "
          "/proc status, identity and root. The mode-bit design is the cost it replaced (and the "
          "hole: a 0644 file in a 0700 folder was read). The child design starts one `python -I -S` per "
          "process, which takes the credentials with setresuid and reads.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
