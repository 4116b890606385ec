"""The recorder's JIT symbol source: per sampled process, its perf map and jitdumps, read as they grow.

The recorder drains the kernel's counts about once per second and calls :meth:`JitSymbols.poll` for each
sampled pid right after, with the drain's time. Entries read then are stamped with that time (jitdump loads
keep their own CLOCK_MONOTONIC time), and a sample (which carries its drain's time) is named after the code
present at its address during that drain period. Files are opened through :mod:`optrace.jitmaps.trust`:
owned by the process's own euid, never through a symlink, inside the process's mount namespace without
crossing its mounts. A process already gone when first seen has no known owner: only user-named jitdumps
are read for it. What one process (and all of them together) may add is bounded by a
:class:`~optrace.jitmaps.symtable.SymbolBudget`; entries over it are dropped and counted.
"""
from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import monotonic

from optrace.fileaccess import printable
from optrace.errors import OptraceError
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.jitcode import JitCodeStore
from optrace.jitmaps.perfmap import PerfMapReader
from optrace.jitmaps.procinfo import ProcessIdentity, read_identity
from optrace.procfs import mapped_jitdumps
from optrace.jitmaps.symtable import SymbolBudget, SymbolHistory
from optrace.jitmaps.trust import (DEFAULT_MAX_SIZE, RefusedFile, jit_file_policy, named_file_policy, open_file,
                                   open_process_root)


MAX_JITDUMPS = 16  # per process: a runtime maps one (perf's agents: one per process and exec)

READ_BUDGET = 2 << 20  # bytes of one JIT file read per poll: 0.13-0.17 s of parsing and adding here (~100-byte lines)
# and at the recording's end, READ_BUDGET at a time, for this long in all (wall time: on a loaded machine a
# byte budget of 8 MiB took 2.8 s)
FINAL_READ_SECONDS = 0.5

@dataclass
class _Source:
    """One perf map or jitdump of one process."""

    display: str  # the path as shown in warnings and frames
    open_path: str  # the path to open, relative to ``dir_fd`` when set
    reader: PerfMapReader | jd.JitDumpReader
    explicit: bool = False  # named by the user (--jitdump): any owner, links followed
    broken: bool = False
    kept: tuple[tuple[int, int], int] | None = None  # (st_dev, st_ino) of the perf map kept open, its id


@dataclass
class _Process:
    pid: int
    identity: ProcessIdentity | None
    root_fd: int | None = None  # O_PATH fd of /proc/PID/root for processes in another mount namespace
    sources: dict[str, _Source] = field(default_factory=dict)
    table: SymbolHistory = field(default_factory=SymbolHistory)
    code_names: dict[int, str] = field(default_factory=dict)  # jitdump code_index -> name, for MOVE
    exited: bool = False
    since: float = float("-inf")  # first poll of a process that reused the pid of an exited one


class JitSymbols:
    def __init__(self, max_file_size: int = DEFAULT_MAX_SIZE, jitdumps: Sequence[str] = (),
                 budget: SymbolBudget | None = None, code: JitCodeStore | None = None,
                 names_in_files: bool = False) -> None:
        """``code``: where JIT functions' bytes are kept for annotate (None: not kept). ``names_in_files``:
        perf maps are kept open and their names read back when a sample needs them, not copied (see
        :mod:`optrace.jitmaps.maplines`: for consumers that forget a process soon after its exit)."""
        self.max_file_size = max_file_size
        self.code = code
        self.names_in_files = names_in_files
        self.budget = budget or SymbolBudget()
        self.warnings: list[str] = []
        self.stats: Counter[str] = Counter()
        self._warned: set[tuple[str, str]] = set()
        self._procs: dict[int, list[_Process]] = {}  # pid -> the processes that had it, oldest first
        self._explicit: dict[int, list[str]] = {}
        for path in jitdumps:
            self._explicit.setdefault(self._explicit_dump_pid(path), []).append(path)

    # -- the recorder's calls -------------------------------------------------------------------------
    def poll(self, pid: int, time: float) -> None:
        proc = self._process(pid)
        if proc.exited and self._pid_reused(proc):
            proc = self._new_process(pid, since=time)
        if not proc.exited:
            self._discover(proc)
            self._read_all(proc, time, final=False, budget=READ_BUDGET)

    def process_exited(self, pid: int, time: float) -> None:
        proc = self._process(pid)
        if not proc.exited:
            self._read_all(proc, time, final=True, budget=READ_BUDGET)
            proc.exited = True
            if proc.root_fd is not None:
                os.close(proc.root_fd)
                proc.root_fd = None

    def finish(self, time: float) -> None:
        for pid in list(self._explicit):
            self._process(pid)
        for pid in list(self._procs):
            self.process_exited(pid, time)
        self._read_rest(time)
        for generations in self._procs.values():
            for proc in generations:
                for source in proc.sources.values():
                    self._count_unread(source)
                    bad = getattr(source.reader, "bad_lines", 0)
                    if bad:
                        self._warn(source.display, "bad_lines", f"{bad} malformed lines skipped",
                                   stat="files_with_bad_lines")

    def _read_rest(self, time: float) -> None:
        """The recording is over: a last read of every file, then more of those not read to their end, in
        turn, until FINAL_READ_SECONDS have passed. A read that did not move on (an incomplete last record)
        is the file's last."""
        deadline = monotonic() + FINAL_READ_SECONDS
        pending = deque((proc, source) for generations in self._procs.values() for proc in generations
                        for source in proc.sources.values())
        while pending and monotonic() < deadline:
            proc, source = pending.popleft()
            if not source.broken:
                offset = source.reader.offset
                self._read(proc, source, time, True, READ_BUDGET)
                if offset < source.reader.offset < source.reader.size_seen:
                    pending.append((proc, source))

    def forget_process(self, pid: int) -> None:
        """Drop an exited process's symbols (for long-running consumers; the recorder keeps them)."""
        if self.code is not None:
            self.code.forget_process(pid)
        for proc in self._procs.pop(pid, ()):
            proc.table.release()
            self._warned = {key for key in self._warned if key[0] not in proc.sources}
            if proc.root_fd is not None:
                os.close(proc.root_fd)
                proc.root_fd = None

    def close(self) -> None:
        """Release every table (and the perf maps they keep open)."""
        for pid in list(self._procs):
            self.forget_process(pid)

    def keep_code(self, pid: int, address: int, time: float) -> None:
        """Keep the bytes of the JIT function at ``address`` (a sampled leaf), read from the live process
        when no jitdump gave them; only while ``pid`` is still the process whose files named it."""
        generations = self._procs.get(pid)
        if self.code is None or not generations or generations[-1].exited or generations[-1].identity is None:
            return
        proc = generations[-1]
        found = proc.table.lookup(address, time)
        if found is None or self.code.has(pid, found.start, found.name):
            return
        now = read_identity(pid)
        if now is not None and now.start_ticks == proc.identity.start_ticks:
            self.code.read_live(pid, found.start, found.size, found.name)

    def lookup(self, pid: int, address: int, time: float) -> tuple[str, str] | None:
        generations = self._procs.get(pid)
        if not generations:
            return None
        proc = next((p for p in reversed(generations) if p.since <= time), generations[0])
        found = proc.table.lookup(address, time)
        return None if found is None else (found.name, found.source)

    # -- discovery ------------------------------------------------------------------------------------
    def _process(self, pid: int) -> _Process:
        generations = self._procs.get(pid)
        return generations[-1] if generations else self._new_process(pid)

    def _new_process(self, pid: int, since: float = float("-inf")) -> _Process:
        proc = _Process(pid, read_identity(pid), since=since, table=SymbolHistory(self.budget))
        self._procs.setdefault(pid, []).append(proc)
        self._add_perf_map(proc)
        for path in self._explicit.get(pid, ()):
            proc.sources[path] = _Source(path, path, jd.JitDumpReader(), explicit=True)
        return proc

    @staticmethod
    def _pid_reused(proc: _Process) -> bool:
        """A sample for an exited pid: a new process has the pid now (or a late sample of the old one)."""
        now = read_identity(proc.pid)
        return now is not None and (proc.identity is None or now.start_ticks != proc.identity.start_ticks)

    def _add_perf_map(self, proc: _Process) -> None:
        """``/tmp/perf-NSPID.map`` as the process sees it: optrace's own path when the process shares
        optrace's mounts, else resolved inside the process's root (see :mod:`optrace.jitmaps.trust`)."""
        ident = proc.identity
        if ident is None:
            self.stats["owner_unknown"] += 1  # gone before it was seen: whose file it would be is unknown
            return
        name = f"tmp/perf-{ident.nspid}.map"
        if ident.host_mounts:
            proc.sources["/" + name] = _Source("/" + name, "/" + name, PerfMapReader(self.names_in_files))
            return
        proc.root_fd = open_process_root(proc.pid)
        if proc.root_fd is not None:
            display = f"/proc/{proc.pid}/root/{name}"
            proc.sources[display] = _Source(display, name, PerfMapReader(self.names_in_files))

    def _discover(self, proc: _Process) -> None:
        """Jitdumps show up in /proc/PID/maps: the runtime maps them so profilers can find them."""
        if proc.identity is None:
            return
        for path in mapped_jitdumps(proc.pid, proc.identity.nspid):
            if proc.root_fd is not None:
                display, open_path = f"/proc/{proc.pid}/root{path}", path.lstrip("/")
            else:
                display = open_path = path
            if display in proc.sources:
                continue
            if len(proc.sources) > MAX_JITDUMPS:
                self._warn(f"/proc/{proc.pid}/maps", "too_many_jitdumps",
                           f"more than {MAX_JITDUMPS} jitdumps mapped: the others are ignored")
                return
            proc.sources[display] = _Source(display, open_path, jd.JitDumpReader())

    # -- reading --------------------------------------------------------------------------------------
    def _read_all(self, proc: _Process, time: float, final: bool, budget: int | None) -> None:
        """Read what each file added; with ``budget`` (bytes per file and call) a huge file is read over
        several drains instead of holding one up (a 1,000,000-line map took 4.6 s in one go)."""
        for source in proc.sources.values():
            if not source.broken:
                self._read(proc, source, time, final, budget)

    def _open(self, proc: _Process, source: _Source) -> int | None:
        """The source's file under the rule for it; None when it does not exist (yet)."""
        if source.explicit:
            return open_file(source.open_path, named_file_policy(self.max_file_size))
        if proc.identity is None:
            return None
        return open_file(source.open_path, jit_file_policy(proc.identity.euid, self.max_file_size),
                         root_fd=proc.root_fd, shown=source.display)

    def _read(self, proc: _Process, source: _Source, time: float, final: bool, budget: int | None) -> None:
        try:
            fd = self._open(proc, source)
        except RefusedFile as refused:
            source.broken = True
            self._warn(source.display, refused.reason, f"ignored: it {refused.detail}")
            return
        if fd is None:
            return
        dropped = proc.table.dropped
        try:
            if isinstance(source.reader, PerfMapReader):
                self._read_perf_map(proc, source, fd, time, final, budget)
            else:
                self._read_jitdump(proc, source, fd, time, final, budget)
        except jd.JitDumpError as exc:
            source.broken = True
            self._warn(source.display, "corrupt", f"ignored from here: not a usable jitdump ({exc})")
        except OSError as exc:  # an I/O error on a trusted file: its names so far are kept
            source.broken = True
            self._warn(source.display, "unreadable", f"ignored from here: {exc.strerror or exc}")
        finally:
            os.close(fd)
        self._count_dropped(source, proc.table.dropped - dropped)

    def _count_unread(self, source: _Source) -> None:
        """What the read budgets left of a file when the recording ended: counted, never read."""
        unread = source.reader.size_seen - source.reader.offset
        if unread > 0 and not source.broken:
            self.stats["unread_bytes"] += unread
            self._warn(source.display, "unread", f"{unread} bytes not read when the recording ended "
                       "(it grew faster than 2 MiB a drain)", stat="files_not_read_to_the_end")

    def _count_dropped(self, source: _Source, dropped: int) -> None:
        if dropped:
            self.stats["symbols_dropped"] += dropped
            self._warn(source.display, "symbol_limit", "symbols over the per-process or total limit "
                       f"({self.budget.describe()}) were dropped", stat="files_over_symbol_limit")

    def _read_perf_map(self, proc: _Process, source: _Source, fd: int, time: float, final: bool,
                       budget: int | None) -> None:
        reader = source.reader
        before_lines, before_bad = reader.lines, reader.bad_lines
        in_file = self._kept_file(proc, source, fd) if reader.with_offsets else None
        proc.table.add_many(reader.read_new(fd, final, self.max_file_size, budget), source.display, time,
                            in_file)
        self.stats["perfmap_lines"] += reader.lines - before_lines
        self.stats["perfmap_bad_lines"] += reader.bad_lines - before_bad

    @staticmethod
    def _kept_file(proc: _Process, source: _Source, fd: int) -> int | None:
        """The id of the kept descriptor of the file ``fd`` is (a replaced map is kept anew: the entries
        read from the old one still name lines in it); None: its names are copied."""
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino)
        if source.kept is None or source.kept[0] != identity:
            file_id = proc.table.keep_file(fd)
            source.kept = None if file_id is None else (identity, file_id)
        return None if source.kept is None else source.kept[1]

    def _read_jitdump(self, proc: _Process, source: _Source, fd: int, time: float, final: bool,
                      budget: int | None) -> None:
        reader = source.reader
        if os.fstat(fd).st_size >= jd.HEADER_SIZE:
            self._check_dump_pid(proc, source, jd.read_header(fd))
        before, before_unknown = reader.records, reader.unknown_records
        for record in reader.read_new(fd, final, self.max_file_size, budget):
            stamp = record.timestamp / 1e9 if reader.header.monotonic else time
            if isinstance(record, jd.CodeLoad) and record.code_size:
                if len(proc.code_names) < self.budget.table_entries or record.code_index in proc.code_names:
                    proc.code_names[record.code_index] = record.name
                proc.table.add(record.code_addr, record.code_size, record.name, source.display, stamp)
                if self.code is not None and record.code:
                    self.code.add(proc.pid, record.code_addr, record.code_size, record.name, record.code)
            elif isinstance(record, jd.CodeMove) and record.code_size:
                name = proc.code_names.get(record.code_index, f"jit-code-{record.code_index}")
                proc.table.add(record.new_code_addr, record.code_size, name, source.display, stamp)
        self.stats["jitdump_records"] += reader.records - before
        self.stats["jitdump_unknown_records"] += reader.unknown_records - before_unknown

    @staticmethod
    def _check_dump_pid(proc: _Process, source: _Source, header: jd.JitDumpHeader) -> None:
        """A dump counts only if its header names this process: no process poses as another's agent."""
        allowed = {proc.pid} | ({proc.identity.nspid} if proc.identity else set())
        if not source.explicit and header.pid not in allowed:
            raise jd.JitDumpError(f"its header names pid {header.pid}")

    def _warn(self, path: str, reason: str, detail: str, stat: str | None = None) -> None:
        """One warning (and one count) per file and reason; the file's content is never part of it."""
        if (path, reason) not in self._warned:
            self.stats[stat or f"refused_{reason}"] += 1
            self._warned.add((path, reason))
            self.warnings.append(f"JIT symbols: {printable(path)}: {detail}")

    def _explicit_dump_pid(self, path: str) -> int:
        """The pid a user-named jitdump belongs to, from its header."""
        try:
            fd = open_file(path, named_file_policy(self.max_file_size))
        except RefusedFile as refused:
            raise OptraceError(f"cannot use --jitdump {refused}") from None
        if fd is None:
            raise OptraceError(f"--jitdump {printable(path)}: no such file")
        try:
            return jd.read_header(fd).pid
        except jd.JitDumpError as exc:
            raise OptraceError(f"--jitdump {printable(path)}: {exc}") from None
        finally:
            os.close(fd)
