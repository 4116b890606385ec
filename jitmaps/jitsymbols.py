"""The recorder's JIT symbol source: per sampled process, its perf map and jitdumps, read as they grow.

The recorder drains the kernel's counts about once per second and calls :meth:`JitSymbols.poll` for each
sampled pid right after, with the drain's time. Entries read then are stamped with that time (jitdump loads
keep their own CLOCK_MONOTONIC time), and a sample (which carries its drain's time) is named after the code
present at its address during that drain period. Files are opened through :mod:`optrace.jitmaps.trust`.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from optrace.frontend.errors import OptraceError
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.perfmap import PerfMapReader
from optrace.jitmaps.procinfo import ProcessIdentity, mapped_jitdumps, read_identity
from optrace.jitmaps.symtable import SymbolHistory
from optrace.jitmaps.trust import DEFAULT_MAX_SIZE, RefusedFile, TrustPolicy, open_trusted, owners_for


@dataclass
class _Source:
    """One perf map or jitdump of one process."""

    display: str  # the path as shown in warnings and frames
    open_path: str  # the path to open, relative to ``dir_fd`` when set
    reader: PerfMapReader | jd.JitDumpReader
    explicit: bool = False  # named by the user (--jitdump): any owner, links followed
    broken: bool = False


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
    def __init__(self, max_file_size: int = DEFAULT_MAX_SIZE, jitdumps: Sequence[str] = ()) -> None:
        self.max_file_size = max_file_size
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
            self._read_all(proc, time, final=False)

    def process_exited(self, pid: int, time: float) -> None:
        proc = self._process(pid)
        if not proc.exited:
            self._read_all(proc, time, final=True)
            proc.exited = True
            if proc.root_fd is not None:
                os.close(proc.root_fd)
                proc.root_fd = None

    def finish(self, time: float) -> None:
        for pid in list(self._explicit):
            self._process(pid)
        for pid in list(self._procs):
            self.process_exited(pid, time)
        for generations in self._procs.values():
            for proc in generations:
                for source in proc.sources.values():
                    bad = getattr(source.reader, "bad_lines", 0)
                    if bad:
                        self._warn(source.display, "bad_lines", f"{bad} malformed lines skipped",
                                   stat="files_with_bad_lines")

    def forget_process(self, pid: int) -> None:
        """Drop an exited process's symbols (for long-running consumers; the recorder keeps them)."""
        for proc in self._procs.pop(pid, ()):
            if proc.root_fd is not None:
                os.close(proc.root_fd)
                proc.root_fd = None

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
        proc = _Process(pid, read_identity(pid), since=since)
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
        ident = proc.identity
        if ident is None or (ident.host_root and ident.nspid == proc.pid):
            path = f"/tmp/perf-{proc.pid}.map"
            proc.sources[path] = _Source(path, path, PerfMapReader())
            return
        try:
            proc.root_fd = os.open(f"/proc/{proc.pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        display = f"/proc/{proc.pid}/root/tmp/perf-{ident.nspid}.map"
        proc.sources[display] = _Source(display, f"tmp/perf-{ident.nspid}.map", PerfMapReader())

    def _discover(self, proc: _Process) -> None:
        """Jitdumps show up in /proc/PID/maps: the runtime maps them so profilers can find them."""
        if proc.identity is None:
            return
        for path in mapped_jitdumps(proc.pid, proc.identity.nspid):
            if proc.root_fd is not None:
                display, open_path = f"/proc/{proc.pid}/root{path}", path.lstrip("/")
            else:
                display = open_path = path
            if display not in proc.sources:
                proc.sources[display] = _Source(display, open_path, jd.JitDumpReader())

    # -- reading --------------------------------------------------------------------------------------
    def _read_all(self, proc: _Process, time: float, final: bool) -> None:
        for source in proc.sources.values():
            if not source.broken:
                self._read(proc, source, time, final)

    def _read(self, proc: _Process, source: _Source, time: float, final: bool) -> None:
        uid = None if proc.identity is None else proc.identity.euid
        policy = TrustPolicy(None if source.explicit else owners_for(uid), self.max_file_size,
                             follow_symlinks=source.explicit)
        dir_fd = None if source.explicit else proc.root_fd
        try:
            fd = open_trusted(source.open_path, policy, dir_fd=dir_fd)
        except RefusedFile as refused:
            source.broken = True
            self._warn(source.display, refused.reason, f"ignored: it {refused.detail}")
            return
        if fd is None:
            return
        try:
            if isinstance(source.reader, PerfMapReader):
                self._read_perf_map(proc, source, fd, time, final)
            else:
                self._read_jitdump(proc, source, fd, time, final)
        except jd.JitDumpError as exc:
            source.broken = True
            self._warn(source.display, "corrupt", f"ignored from here: not a usable jitdump ({exc})")
        finally:
            os.close(fd)

    def _read_perf_map(self, proc: _Process, source: _Source, fd: int, time: float, final: bool) -> None:
        reader = source.reader
        before_lines, before_bad = reader.lines, reader.bad_lines
        proc.table.add_many(reader.read_new(fd, final), source.display, time)
        self.stats["perfmap_lines"] += reader.lines - before_lines
        self.stats["perfmap_bad_lines"] += reader.bad_lines - before_bad

    def _read_jitdump(self, proc: _Process, source: _Source, fd: int, time: float, final: bool) -> None:
        reader = source.reader
        if os.fstat(fd).st_size >= jd.HEADER_SIZE:
            self._check_dump_pid(proc, source, jd.parse_header(os.pread(fd, jd.HEADER_SIZE, 0)))
        before, before_unknown = reader.records, reader.unknown_records
        for record in reader.read_new(fd, final):
            stamp = record.timestamp / 1e9 if reader.header.monotonic else time
            if isinstance(record, jd.CodeLoad):
                proc.code_names[record.code_index] = record.name
                proc.table.add(record.code_addr, record.code_size, record.name, source.display, stamp)
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
        """One warning per file and reason; the file's content is never part of it."""
        self.stats[stat or f"refused_{reason}"] += 1
        if (path, reason) not in self._warned:
            self._warned.add((path, reason))
            self.warnings.append(f"JIT symbols: {path}: {detail}")

    def _explicit_dump_pid(self, path: str) -> int:
        """The pid a user-named jitdump belongs to, from its header."""
        try:
            fd = open_trusted(path, TrustPolicy(None, self.max_file_size, follow_symlinks=True))
        except RefusedFile as refused:
            raise OptraceError(f"cannot use --jitdump {refused}") from None
        if fd is None:
            raise OptraceError(f"--jitdump {path}: no such file")
        try:
            return jd.parse_header(os.pread(fd, jd.HEADER_SIZE, 0)).pid
        except jd.JitDumpError as exc:
            raise OptraceError(f"--jitdump {path}: {exc}") from None
        finally:
            os.close(fd)
