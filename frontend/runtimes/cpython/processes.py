"""The Python processes of a profiling session: which ones the BPF walker expands (and why the others are not),
and the names of their frames.

The session shows each process to :meth:`PythonProcesses.look_at` when its unwind table is loaded (and again
after an exec or a new mapping); a process that maps a file named like an interpreter is looked at by
:func:`find_interpreter`, and either handed to the walker or given a reason, kept as its outcome. The walker's
captures of code objects (bpf/pythonmaps.py) are decoded as drains hand them over, by process and code object
address; a frame whose code object was not captured is read from the live process (:func:`read_code`).
Everything about a process goes when the session forgets it.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from optrace.frontend.runtimes.cpython import FRAME_KIND
from optrace.frontend.runtimes.cpython.codeobject import CodeInfo, decode_capture, read_code
from optrace.frontend.runtimes.cpython.gilfunction import TAKE_GIL
from optrace.frontend.runtimes.cpython.interpreter import INTERPRETER_NAME, find_interpreter, python_mappings
from optrace.frontend.runtimes.cpython.interpreterfile import InterpreterFile, interpreter_file
from optrace.frontend.runtimes.cpython.sourcecapture import SourceOwner, source_owner
from optrace.model import UNKNOWN, Frame
from optrace.procfs import MapEntry, start_ticks, stat_fields
from optrace.pythonlayout import CAPTURE_HEADER, PythonProcess, python_frame_parts

PYTHON_DSO = "[python]"  # the dso of a Python frame whose code object could not be named
# A process looked at between its exec and Py_Initialize: looked at again, soon at first (a command's first
# samples wait for it), then RETRY_SECONDS apart, RETRIES times in all
RETRY_REASONS = frozenset({"interpreter not initialized"})
FIRST_RETRY_SECONDS = 0.05
FIRST_RETRIES = 10
RETRY_SECONDS = 0.2
RETRIES = 30
MAX_CODES_PER_PROCESS = 65536  # code objects named per process (a process making code objects in a loop)
# Bytes of line tables decoded per process (about 0.5 ms a KiB): 16,000 code objects of the median table
# (62 bytes in 3.11's standard library), 1,000 of the most a capture holds; the code objects a process names
# beyond have no lines (issue 40: 16,384 code objects of 1 KiB tables, a new one at every frame, held
# record's end for 50 s at load 30)
MAX_TABLE_BYTES_PER_PROCESS = 1 << 20


class InterpreterSymbols(Protocol):
    """What the symbolizer learns of an interpreter file (frontend/symbols/symbolizer.py): functions its symbols
    may not name (take_gil, for GIL waits), and which file it is (its frames are the interpreter's own)."""

    def add_names(self, build_id: bytes, start: int, end: int, name: str) -> None: ...

    def add_interpreter(self, build_id: bytes | None, file_key: tuple[str, int]) -> None: ...


@dataclass(frozen=True)
class PythonOutcome:
    """What became of a process that maps an interpreter: ``process`` when the walker expands it, else why not
    (``looked``: when, monotonic; ``tries``: how many looks gave this reason)."""

    process: PythonProcess | None
    reason: str = ""
    looked: float = 0.0
    tries: int = 1
    owner: SourceOwner | None = None  # whom its source files are read for (sourcecapture.py)


class PythonProcesses:
    """``load``: hands a process to the walker (bpf/pythonmaps.py PythonMaps.load_process). Thread-safe: the
    session's unwind worker looks at processes while the drain loop names frames."""

    def __init__(self, load: Callable[[PythonProcess, int], None], symbols: InterpreterSymbols | None = None) -> None:
        self._load = load
        self._symbols = symbols
        self._lock = threading.Lock()
        self._outcomes: dict[int, PythonOutcome] = {}
        self._codes: dict[int, dict[int, CodeInfo | None]] = {}
        self._table_bytes: Counter[int] = Counter()  # pid -> line-table bytes decoded
        self.stats: Counter[str] = Counter()  # captures decoded, undecodable, live reads, ...

    @staticmethod
    def may_run_python(names: Iterable[str]) -> bool:
        """Whether a process mapping files of these names may run an interpreter (one is named like one)."""
        return any(INTERPRETER_NAME.match(name) for name in names)

    def look_at(self, pid: int, maps: Iterable[MapEntry]) -> PythonOutcome | None:
        """Find the process's interpreter (None when it maps none). The walker has it from now on."""
        maps = list(maps)
        if not python_mappings(maps):
            return None
        found = find_interpreter(pid, maps)
        now = time.monotonic()
        if isinstance(found, str):
            before = self.outcome(pid)
            tries = before.tries + 1 if before is not None and before.reason == found else 1
            outcome = PythonOutcome(None, found, now, tries)
        else:
            self._tell_symbols(pid, found, maps)  # before the walker: its Python frames' callees are marked
            fields = stat_fields(pid)
            self._load(found, start_ticks(fields) if fields else pid)
            outcome = PythonOutcome(found, looked=now, owner=source_owner(pid))
        with self._lock:
            self._outcomes[pid] = outcome
        return outcome

    def _tell_symbols(self, pid: int, process: PythonProcess, maps: list[MapEntry]) -> None:
        entry = next((m for m in maps if m.file_path == process.path), None)
        if self._symbols is None or entry is None:
            return
        facts = interpreter_file(pid, entry)
        build_id = facts.segments.build_id if isinstance(facts, InterpreterFile) else None
        self._symbols.add_interpreter(build_id, entry.file_key)
        if isinstance(facts, InterpreterFile) and facts.gil and build_id:
            self._symbols.add_names(build_id, *facts.gil, TAKE_GIL)

    def to_retry(self, now: float) -> list[int]:
        """Processes refused for a reason that passes (an interpreter not initialized yet), due a new look
        (each given once per RETRY_SECONDS: the look itself may wait on the session's worker)."""
        with self._lock:
            due = [pid for pid, o in self._outcomes.items() if o.reason in RETRY_REASONS and o.tries < RETRIES
                   and now - o.looked >= (FIRST_RETRY_SECONDS if o.tries < FIRST_RETRIES else RETRY_SECONDS)]
            for pid in due:
                self._outcomes[pid] = dataclasses.replace(self._outcomes[pid], looked=now)
            return due

    def outcome(self, pid: int) -> PythonOutcome | None:
        with self._lock:
            return self._outcomes.get(pid)

    def outcomes(self) -> dict[int, PythonOutcome]:
        with self._lock:
            return dict(self._outcomes)

    def add_captures(self, captures: Iterable[bytes]) -> None:
        """The walker's captures (bpf/pythonmaps.py take_captures), decoded with their process's layout."""
        for capture in captures:
            pid, _failed, address = CAPTURE_HEADER.unpack_from(capture)
            outcome = self.outcome(pid)
            if outcome is None or outcome.process is None:
                self.stats["captures_without_process"] += 1
                continue
            info = decode_capture(capture, outcome.process.layout)
            self.stats["captures" if info is not None else "captures_undecodable"] += 1
            codes = self._codes.setdefault(pid, {})
            if info is not None or address not in codes:
                if len(codes) < MAX_CODES_PER_PROCESS or address in codes:
                    codes[address] = info

    def frame(self, pid: int, word: int) -> Frame:
        """The Frame of a Python frame word of this process's samples."""
        address, instr = python_frame_parts(word)
        info = self._code(pid, address)
        if info is None:
            return Frame(f"[python code 0x{address:x}]", PYTHON_DSO, FRAME_KIND, address=address, resolved=False)
        return Frame(info.qualname or info.name or UNKNOWN, info.filename or PYTHON_DSO, FRAME_KIND,
                     address=info.firstlineno, line=self._line(pid, info, instr))

    def _line(self, pid: int, info: CodeInfo, instr: int) -> int:
        """The instruction's line, 0 when its table would go past the process's MAX_TABLE_BYTES_PER_PROCESS."""
        if not info.indexed:
            if self._table_bytes[pid] + len(info.linetable) > MAX_TABLE_BYTES_PER_PROCESS:
                self.stats["lines_over_budget"] += 1
                return 0
            self._table_bytes[pid] += len(info.linetable)
        return info.line(instr)

    def forget(self, pid: int) -> None:
        with self._lock:
            self._outcomes.pop(pid, None)
        self._codes.pop(pid, None)
        self._table_bytes.pop(pid, None)

    def _code(self, pid: int, address: int) -> CodeInfo | None:
        codes = self._codes.setdefault(pid, {})
        if address in codes:
            return codes[address]
        if len(codes) >= MAX_CODES_PER_PROCESS:
            return None  # not read at every frame: a process naming more code objects would keep optrace reading
        outcome = self.outcome(pid)
        info = None
        if outcome is not None and outcome.process is not None:
            info = read_code(pid, address, outcome.process.layout)
            self.stats["live_reads" if info is not None else "live_reads_failed"] += 1
        codes[address] = info
        return info
