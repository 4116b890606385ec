"""The toy runtime: what the next runtime implements, at its smallest (frontend/runtimes/runtime.py).

A toy process runs an executable named ``toyvm``; its functions are listed in ``toyvm.functions`` beside the
executable (``name file line`` a line, at most MAX_FUNCTIONS, read once per file). Its frame word holds a
function's index and the line it runs (``own = index << 16 | line``). Detection looks at mapped file names
only; a toyvm without its table is refused with its reason, counted, never guessed.
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from optrace.frontend.runtimes.runtime import SessionContext
from optrace.model import NAMED, Frame, RawSample, RuntimeCounts, RuntimeSource, Sample
from optrace.procfs import MapEntry
from optrace.runtimeword import runtime_word

NAME = "toy"
RUNTIME_ID = 15
EXECUTABLE = "toyvm"
VERSION = "1.0"
MAX_FUNCTIONS = 64
MAX_TABLE_BYTES = 4096


@dataclass(frozen=True)
class ToyFunction:
    name: str
    file: str
    first_line: int


def toy_word(index: int, line: int) -> int:
    """The word the toy's walker would store for function ``index`` at ``line``."""
    return runtime_word(RUNTIME_ID, index << 16 | line & 0xFFFF)


def read_table(executable: str) -> list[ToyFunction] | str:
    """The toy's functions, or why not (a str)."""
    try:
        with open(executable + ".functions", "rb") as table:
            text = table.read(MAX_TABLE_BYTES + 1)
    except OSError:
        return "no function table"
    if len(text) > MAX_TABLE_BYTES:
        return "function table too large"
    functions = []
    for line in text.decode("utf-8", "replace").splitlines()[:MAX_FUNCTIONS]:
        parts = line.split()
        if len(parts) != 3 or not parts[2].isdigit():
            return "function table malformed"
        functions.append(ToyFunction(parts[0], parts[1], int(parts[2])))
    return functions


@dataclass
class ToyPart:
    """The toy's part of a session."""

    outcomes: dict[int, str] = field(default_factory=dict)  # pid -> "1.0 <path>" or "refused: <why>"
    functions: dict[int, list[ToyFunction]] = field(default_factory=dict)
    named: Counter[str] = field(default_factory=Counter)
    exited_pids: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def look_at(self, pid: int, maps: Iterable[MapEntry]) -> None:
        entry = next((m for m in maps if m.is_file and Path(m.file_path).name == EXECUTABLE), None)
        if entry is None:
            return
        table = read_table(entry.file_path)
        with self.lock:
            if isinstance(table, str):
                self.outcomes[pid] = f"refused: {table}"
            else:
                self.outcomes[pid] = f"{VERSION} {entry.file_path}"
                self.functions[pid] = table

    def may_run(self, names: Iterable[str]) -> bool:
        return EXECUTABLE in names

    def to_retry(self, now: float) -> list[int]:
        return []

    def frame(self, pid: int, word: int) -> Frame:
        own = word & ((1 << 56) - 1)
        index, line = own >> 16, own & 0xFFFF
        with self.lock:
            functions = self.functions.get(pid, [])
        if index >= len(functions):
            self.named["unnamed"] += 1
            return Frame(f"[toy function {index}]", "[toy]", NAME, address=index, resolved=False)
        self.named["named"] += 1
        function = functions[index]
        return Frame(function.name, function.file, NAME, address=function.first_line, line=line)

    def drained(self) -> None:
        pass

    def exited(self, pid: int) -> None:
        self.exited_pids.append(pid)

    def forget(self, pid: int) -> None:
        with self.lock:
            self.functions.pop(pid, None)

    def counts(self, raw: Sequence[RawSample], frames: Sequence[Frame], rows: Sequence[Sample]) -> RuntimeCounts | None:
        with self.lock:
            outcomes = dict(self.outcomes)
        if not outcomes:
            return None
        samples: Counter[str] = Counter()
        for sample, row in zip(raw, rows, strict=True):
            outcome = outcomes.get(sample.pid)
            if outcome is None:
                continue
            if outcome.startswith("refused"):
                samples[outcome] += sample.count
            else:
                samples[NAMED if any(frames[i].kind == NAME for i in row.frames) else "native_only"] += sample.count
        return RuntimeCounts("Toy", "ToyVM", dict(samples), dict(Counter(outcomes.values())), dict(self.named))

    def sources(self, frames: Sequence[Frame], rows: Sequence[Sample]) -> list[RuntimeSource]:
        return []


@dataclass(frozen=True)
class Toy:
    name: str = NAME
    runtime_id: int = RUNTIME_ID

    def start(self, context: SessionContext) -> ToyPart:
        return ToyPart()

    def check(self) -> None:
        return None


TOY = Toy()
