"""JIT functions' machine code, kept for `optrace annotate`: JIT code lives in anonymous memory that is
freed or reused, so its bytes are taken while they are there.

Two sources: a jitdump's CODE_LOAD record carries the code bytes (the runtime wrote them, in a file read
under the trust rules of :mod:`optrace.jitmaps.trust`); for code named only by a perf map, the bytes are
read from ``/proc/PID/mem`` while the process lives, for the symbols its samples hit. That read is of the
sampled process's own memory, bounded to the symbol's size (itself capped), and only while the process
is the one whose perf map named the symbol (same start time), so a reused pid never lends its bytes.

Bounded: at most ``max_function`` bytes of one function, ``max_total`` bytes in all (first come, first
kept); what does not fit is not kept (annotate then lists the function as having no code).
"""
from __future__ import annotations

from dataclasses import dataclass

from optrace.procfs import read_process_memory

MAX_FUNCTION_BYTES = 64 << 10
MAX_TOTAL_BYTES = 32 << 20


@dataclass(frozen=True)
class JitCode:
    """One JIT function's code: ``code`` starts at ``start``; ``size`` is the function's whole size."""

    name: str
    start: int
    size: int
    code: bytes


class JitCodeStore:
    def __init__(self, max_function: int = MAX_FUNCTION_BYTES, max_total: int = MAX_TOTAL_BYTES) -> None:
        self.max_function = max_function
        self.max_total = max_total
        self.total = 0
        self.dropped = 0  # functions whose code did not fit the budget
        self._code: dict[int, dict[int, JitCode]] = {}  # pid -> start -> newest code known there

    def add(self, pid: int, start: int, size: int, name: str, code: bytes) -> None:
        """A function's bytes (the first ``max_function`` of them are kept)."""
        kept = code[: self.max_function]
        old = self._code.get(pid, {}).get(start)
        freed = len(old.code) if old is not None else 0
        if self.total - freed + len(kept) > self.max_total:
            self.dropped += 1
            return
        self.total += len(kept) - freed
        self._code.setdefault(pid, {})[start] = JitCode(name, start, size, kept)

    def has(self, pid: int, start: int, name: str) -> bool:
        found = self._code.get(pid, {}).get(start)
        return found is not None and found.name == name

    def find(self, pid: int, address: int, name: str) -> JitCode | None:
        """The code named ``name`` covering ``address`` in ``pid``."""
        for code in self._code.get(pid, {}).values():
            if code.name == name and code.start <= address < code.start + code.size:
                return code
        return None

    def read_live(self, pid: int, start: int, size: int, name: str) -> None:
        """Read a perf-map symbol's bytes from the live process (nothing when it is gone or unreadable)."""
        if self.has(pid, start, name) or size <= 0:
            return
        code = read_process_memory(pid, start, min(size, self.max_function))
        if code:
            self.add(pid, start, size, name, code)

    def forget_process(self, pid: int) -> None:
        for code in self._code.pop(pid, {}).values():
            self.total -= len(code.code)
