"""Makes the replay's Python snapshots from live processes (run as root, from the repo):

    .venv/bin/python tests/replay/make_snapshot.py [3.8 3.9 ... 3.11-debian 3.14-sid 3.15-sid]

For each interpreter: start programs/pystack.py, stop its thread (ptrace) where it spins, walk it with the
replay library reading the live process (so the walk is the kernel's rules, as in a recording), keep the pages
the walk and the interpreter's detection read and the unwind rows it looked at, and check the stack against
the program's design (its Python frames and their call lines, a native frame of sorted() between
through_builtin and the lambda) and the interpreter's thread list against the process's threads before it is
stored under snapshots/. A thread stopped where the design is not met is tried again (a few times) and said.

Debian sid's interpreters run in a container of the sid root (tests/python/pythons.py): a mount namespace of
their own, the same pid. Their memory is read as any process's; their files (for the frames' symbol names)
through /proc/PID/map_files, else the process's root (/proc/PID/root), never by the host's paths.
"""
from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "python"), str(HERE.parents[1] / "bench")]

from optrace.bpf.pythonmaps import python_status_name  # noqa: E402
from optrace.bpf.unwindmaps import UNWIND_STATUSES  # noqa: E402
from optrace.frontend.runtimes.cpython.interpreter import find_interpreter  # noqa: E402
from optrace.frontend.runtimes.cpython.memory import ProcessMemory  # noqa: E402
from optrace.frontend.symbols.access import FileRef, open_mapped_file  # noqa: E402
from optrace.frontend.symbols.dso import Dso, DsoContext  # noqa: E402
from optrace.frontend.unwind.processmaps import ProcessUnwinding  # noqa: E402
from optrace.frontend.unwind.row import ROW  # noqa: E402
from optrace.procfs import read_maps  # noqa: E402

import pythons  # noqa: E402
from replay import Replay, ReplayMapping, build  # noqa: E402
from snapshots import PAGE, LoggedMemory, Snapshot, SnapshotMapping, named_frames, save, thread_problem  # noqa: E402
from threadstop import stopped  # noqa: E402

PROGRAM = HERE / "programs" / "pystack.py"
DESIGN = ("leaf", "<lambda>", "through_builtin", "mïddle", "внешний", "<module>")  # innermost first
CALL_LINES = {"<lambda>": 18, "through_builtin": 18, "mïddle": 24, "внешний": 29, "<module>": 39}
ATTEMPTS = 20
# The program's str and bytes hashes (3.10+ caches its code objects' line tables' hashes, next to ob_size) are
# the same at every making: what a layout field moved by one byte reads next to them is too.
HASH_SEED = "0"


def design_problem(frames) -> str | None:
    """None when the stack is the program's, else what is wrong."""
    python = [f for f in frames if f.kind == "python"]
    if tuple(f.name.split(".")[-1] for f in python) != DESIGN:
        return f"python frames {[f.name for f in python]}"
    for frame in python[1:]:
        if frame.line != CALL_LINES[frame.name.split(".")[-1]] or frame.file != PROGRAM.name:
            return f"{frame.name} at {frame.file}:{frame.line}"
    lambda_at, caller_at = frames.index(python[1]), frames.index(python[2])
    if not any(f.kind == "native" for f in frames[lambda_at:caller_at]):
        return "no native frame between the lambda and through_builtin"
    return None


def make(version: str, replay: Replay) -> Path:
    exe = pythons.interpreter(version)
    if exe is None:
        raise SystemExit(f"python {version} is not installed")
    with pythons.child([*pythons.command(version), str(PROGRAM)], lines=1) as (proc, _):
        time.sleep(0.5)
        pid = proc.pid
        memory = LoggedMemory(pid)
        entries = read_maps(pid).entries
        import optrace.frontend.runtimes.cpython.interpreter as interpreter_module
        interpreter_module.ProcessMemory = lambda _pid: memory  # the detection's reads are kept too
        try:
            process = find_interpreter(pid, entries)
        finally:
            interpreter_module.ProcessMemory = ProcessMemory
        if isinstance(process, str):
            raise SystemExit(f"{version}: {process}")
        paths = {entry.start: entry.file_path for entry in entries}
        ids: dict = {}
        mappings = []
        for m in ProcessUnwinding().mappings(pid):
            file_id = ids.setdefault(m.file_key, len(ids) + 1) if m.build_id is not None else 0
            mappings.append((m, file_id, paths.get(m.start, "")))
        replay_maps = [ReplayMapping(m.start, m.end, m.file_offset, m.bias, file_id, m.rows or b"")
                       for m, file_id, _ in mappings]
        for attempt in range(ATTEMPTS):
            replay.reset()
            replay.load_process(replay_maps, process)
            replay.set_reader(lambda address, size: memory.read_exact(address, size))
            with stopped(pid) as regs:
                result = replay.sample(regs.ip, regs.sp, regs.bp, regs.fs_base)
                reads = replay.reads()
                for address, size in reads:
                    memory.pages.update(range(address & ~(PAGE - 1), address + max(size, 1), PAGE))
                snapshot_maps = _snapshot_mappings(mappings, result.rows_looked_up)
                frames = named_frames(result.words, result.captures, process.layout, snapshot_maps, memory,
                                      _symbols(pid, entries, mappings, result.words))
                tids = tuple(sorted(int(task) for task in os.listdir(f"/proc/{pid}/task")))
                threads = thread_problem(process, memory, pid, regs.fs_base, tids)
                pages = memory.page_bytes()
            replay.set_reader(None)
            problem = design_problem(frames) or threads
            if problem is None:
                break
            print(f"{version}: attempt {attempt + 1}: not the design ({problem})", file=sys.stderr)
        else:
            raise SystemExit(f"{version}: no stop met the design in {ATTEMPTS} attempts")
    snapshot = Snapshot(
        name=f"python-{version}",
        about={"made": datetime.date.today().isoformat(), "interpreter": str(exe), "program": PROGRAM.name,
               "by": "tests/replay/make_snapshot.py", "attempts": attempt + 1},
        registers={"ip": regs.ip, "sp": regs.sp, "bp": regs.bp, "fs_base": regs.fs_base},
        python={"version": process.version, "minor": list(process.layout.version), "path": process.path,
                "runtime": process.runtime, "eval_ranges": [list(r) for r in process.eval_ranges]},
        mappings=tuple(snapshot_maps), pages=pages,
        expected=frames, status=UNWIND_STATUSES[result.status], python_status=python_status_name(result.python_status),
        tid=pid, tids=tids)
    return save(snapshot)


def _snapshot_mappings(mappings, looked_up) -> list[SnapshotMapping]:
    """Each mapping with the rows the walk read of it (the binary searches' probes: the row found and the one
    after it are among them, so the same search over these alone finds the same rows)."""
    wanted = set(looked_up)
    out, at = [], 0
    for m, file_id, path in sorted(mappings, key=lambda triple: triple[0].start):
        rows = m.rows or b""
        count = len(rows) // ROW.size
        kept = []
        for index in sorted(i - at for i in wanted if at <= i < at + count):
            pc, cfa_offset, rbp_offset, cfa_type, rbp_type = ROW.unpack_from(rows, index * ROW.size)
            kept.append((pc, cfa_type, cfa_offset, rbp_type, rbp_offset))
        at += count
        if kept or file_id:
            out.append(SnapshotMapping(m.start, m.end, m.file_offset, m.bias, Path(path).name, file_id, tuple(kept)))
    return out


def _symbols(pid: int, entries, mappings, words) -> dict[tuple[str, int], str]:
    """Function names of the file frames (for people reading the snapshot). Each file is read as the process
    maps it (/proc/PID/map_files, else its root): sid's interpreters live in a mount namespace of their own."""
    files = {file_id: m.start for m, file_id, _ in mappings if file_id}
    by_start = {entry.start: entry for entry in entries}
    names = {}
    for word in words:
        if word >> 63:
            file_id, offset = (word >> 40) & ((1 << 23) - 1), word & ((1 << 40) - 1)
            entry = by_start.get(files.get(file_id, -1))
            fd = open_mapped_file(pid, entry) if entry is not None else None
            if fd is None:
                continue
            try:
                dso = Dso(entry.file_path, DsoContext((), lambda _message: None),
                          source=FileRef(entry.file_path, None, fd=fd))
                names[(Path(entry.file_path).name, offset)] = dso.symbol_at(offset) or ""
            finally:
                os.close(fd)
    return names


def main(argv: list[str]) -> None:
    os.environ["PYTHONHASHSEED"] = HASH_SEED
    replay = Replay(build())
    for version in argv or pythons.SUPPORTED:
        print(make(version, replay))


if __name__ == "__main__":
    main(sys.argv[1:])
