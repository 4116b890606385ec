"""Unwind tables: an executable file's call-frame information as rows sorted by PC, for the BPF unwinder.

The contract with ``bpf/`` (do not change one side alone):

- ``ROW`` is ``struct unwind_row { u64 pc; s32 cfa_offset; s16 rbp_offset; u8 cfa_type; u8 rbp_type; }``,
  16 bytes little-endian; ``pc`` is the file's own virtual address (as in its symbol table, before any
  load bias) where the row starts, and the row holds until the next row's pc.
- ``cfa_type``: CFA_RSP (cfa = rsp + off), CFA_RBP (cfa = rbp + off), CFA_PLT (cfa = rsp + off +
  ((pc & 15) >= 11 ? 8 : 0), the lazy .plt), CFA_END (no CFI until the next row: fall back to frame
  pointers), CFA_UNSUPPORTED (stop, counted as "expression"), CFA_OUTERMOST (return address undefined:
  the stack is complete). ``rbp_type``: RBP_SAME, RBP_AT_CFA (caller's rbp = *(cfa + rbp_offset)),
  RBP_UNSUPPORTED (stop). The return address is always *(cfa - 8); an FDE whose return-address rule is
  anything else gives CFA_UNSUPPORTED rows.
- Rows are sorted by pc, no two share a pc, consecutive identical rules are merged, and the last row is
  CFA_END (after the last FDE). PLT expressions with another threshold than 11 (binutils' IBT .plt uses
  10) are written out as explicit CFA_RSP rows per 16-byte entry, so the walker needs one PLT type only.

Additions to the first contract (compatible): ``UnwindTable.problems``/``problem`` (malformed CFI, counted),
``find(pc)``, ``rule(i)``, ``pcs()`` and ``nbytes``; ``source`` is ".eh_frame+.debug_frame" when both
sections gave FDEs (a binary built with -g -fno-asynchronous-unwind-tables: its own code in .debug_frame,
the C runtime's start files in .eh_frame).
"""
from __future__ import annotations

import io
import struct
import sys
import time
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import islice
from typing import BinaryIO

from optrace.fileaccess import BudgetExceeded
from optrace.heap import gc_paused
from optrace.frontend.symbols.elffile import ElfFile, ElfFormatError
from optrace.frontend.symbols.cfi import Section, cfi_sections, read_fdes, read_section
from optrace.frontend.symbols.leb128 import DwarfError
from optrace.frontend.unwind.row import (CFA_END, CFA_OUTERMOST, CFA_PLT, CFA_RBP, CFA_RSP, CFA_UNSUPPORTED, END,
                                         RBP_AT_CFA, RBP_SAME, RBP_UNSUPPORTED, ROW, UNSUPPORTED, Rule)
from optrace.frontend.unwind.rules import PLT_EXPAND, UNSUPPORTED_PROGRAM, Program, ProgramRunner, add_row

__all__ = ["ROW", "CFA_RSP", "CFA_RBP", "CFA_PLT", "CFA_END", "CFA_UNSUPPORTED", "CFA_OUTERMOST", "RBP_SAME",
           "RBP_AT_CFA", "RBP_UNSUPPORTED", "Rule", "UnwindTable", "build_table", "EMPTY"]

EM_X86_64 = 62
MAX_ROWS = 1 << 21  # 32 MiB of rows (cc1: 0.48 M rows); past it the table stops there, counted
MAX_PLT_ENTRIES = 1 << 16  # entries written out for a PLT expression with an unusual threshold
# CPU time of the building thread per file (time.thread_time: the machine's load does not count; cc1
# takes 0.26-0.38 s). The decoding is linear in the section's size, which cfi.MAX_SECTION_BYTES bounds already:
# this bounds what a crafted section of that size could cost.
BUILD_SECONDS = 10.0
# Work between two looks at the clock and at ``stop``: an FDE counts its program's bytes (at most one
# instruction each) and FDE_WORK for the rest, so that is every 1024 FDEs of a compiler's output and
# every 64 KiB of instructions of a crafted file's long programs.
CHECK_WORK = 1 << 16
FDE_WORK = 64
_RULE = struct.Struct("<ihBB")  # ROW without its pc
assert ROW.format == "<Q" + _RULE.format[1:]


@dataclass(frozen=True)
class UnwindTable:
    rows: bytes  # count * ROW.size bytes
    count: int
    source: str  # ".eh_frame" | ".debug_frame" | ".eh_frame+.debug_frame" | "" (no CFI at all)
    unsupported: int  # rows marked CFA_UNSUPPORTED or RBP_UNSUPPORTED
    problems: int = 0  # malformed FDEs or sections (their PCs get CFA_UNSUPPORTED or no rows)
    problem: str = ""  # the first problem, for a warning

    @property
    def nbytes(self) -> int:
        return len(self.rows)

    @cached_property
    def _pcs(self) -> memoryview:
        return memoryview(self.rows).cast("Q")[::2] if self.rows else memoryview(b"").cast("Q")

    def pcs(self) -> memoryview:
        """The rows' pcs (a read-only sequence of ints)."""
        return self._pcs

    def rule(self, index: int) -> Rule:
        _, cfa_offset, rbp_offset, cfa_type, rbp_type = ROW.unpack_from(self.rows, index * ROW.size)
        return Rule(cfa_type, cfa_offset, rbp_type, rbp_offset)

    def find(self, pc: int) -> Rule | None:
        """The rule for ``pc`` as the BPF walker looks it up (None before the first row)."""
        index = bisect_right(self._pcs, pc) - 1
        return self.rule(index) if index >= 0 else None

    def __iter__(self) -> Iterator[tuple[int, Rule]]:
        for pc, cfa_offset, rbp_offset, cfa_type, rbp_type in ROW.iter_unpack(self.rows):
            yield pc, Rule(cfa_type, cfa_offset, rbp_type, rbp_offset)


EMPTY = UnwindTable(b"", 0, "", 0)


def _never() -> bool:
    return False


def build_table(source: bytes | BinaryIO | ElfFile, seconds: float = BUILD_SECONDS,
                stop: Callable[[], bool] = _never) -> UnwindTable:
    """The unwind table of an x86-64 ELF file (its bytes, a seekable bounded reader or an ElfFile).

    FDEs come from ``.eh_frame`` and from ``.debug_frame`` (a separate debug file has only the latter; a
    binary built with ``-g -fno-asynchronous-unwind-tables`` has its own code in ``.debug_frame`` and the
    C runtime's in ``.eh_frame``); where both describe a PC, ``.eh_frame`` wins. Malformed call-frame
    information gives a partial table (what was decoded before the fault, bad FDEs as CFA_UNSUPPORTED)
    with ``problems`` counted; a file for another machine (i386, aarch64) has the empty table. Raises
    ElfFormatError when ``source`` is not a well-formed ELF file, OSError when it cannot be read.
    ``stop`` is asked along with the CPU budget: once it says so the build ends there (a partial table),
    so a session that is ending never waits out a large or crafted file's build."""
    elf = source if isinstance(source, ElfFile) else ElfFile(io.BytesIO(source) if isinstance(source, bytes) else source)
    if elf.machine != EM_X86_64 or elf.elfclass != 64:
        return EMPTY  # not a fault of the file: rows are for x86-64 only (its code is walked by frame pointers)
    with gc_paused():
        return _build(elf, time.thread_time() + seconds, stop)


def _build(elf: ElfFile, deadline: float, stop: Callable[[], bool]) -> UnwindTable:
    problems: list[str] = []
    fdes: list[tuple[int, int, Program]] = []
    names = []
    for header in cfi_sections(elf):
        name = header.name
        try:
            found = _decode(read_section(elf, header), deadline, problems, stop)
        except (BudgetExceeded, ElfFormatError) as err:
            problems.append(f"{name}: {err}")
            continue
        if found:
            fdes = _merge(fdes, found)
            names.append(name)
    if not fdes and not problems:
        return EMPTY
    return _table(fdes, "+".join(names), problems)


def _merge(primary: list[tuple[int, int, Program]], extra: list[tuple[int, int, Program]]) -> list[tuple[int, int, Program]]:
    """Both lists' FDEs sorted by start, without those of ``extra`` that overlap one of ``primary``."""
    if not primary:
        return extra
    starts = [fde[0] for fde in primary]
    kept = []
    for fde in extra:
        index = bisect_right(starts, fde[0])
        if (index and primary[index - 1][1] > fde[0]) or (index < len(primary) and starts[index] < fde[1]):
            continue
        kept.append(fde)
    return sorted(primary + kept, key=lambda fde: fde[0])


def _table(fdes: list[tuple[int, int, Program]], source: str, problems: list[str]) -> UnwindTable:
    pcs, rules = _assemble(fdes, problems)
    count = len(pcs)
    unsupported = sum(n for rule, n in Counter(rules).items() if rule.unsupported)
    rows = bytearray(count * ROW.size)  # filled as two interleaved columns of u64: pcs and rules
    view = memoryview(rows).cast("Q")
    view[0::2] = _little(pcs)
    del pcs  # each column is freed before the next one is made: cc1's pcs and rules take 8 MB as arrays
    words = _RuleWords()
    view[1::2] = _little(array("Q", map(words.__getitem__, rules)))
    del rules, view
    return UnwindTable(bytes(rows), count, source, unsupported, len(problems), problems[0] if problems else "")


def _little(values: array) -> array:
    if sys.byteorder != "little":
        values.byteswap()
    return values


class _RuleWords(dict):
    """Rule -> the last 8 bytes of its rows (ROW after the pc) as a little-endian u64, each packed once."""

    def __missing__(self, rule: Rule) -> int:
        word = self[rule] = int.from_bytes(_RULE.pack(rule.cfa_offset, rule.rbp_offset, rule.cfa_type, rule.rbp_type),
                                           "little")
        return word


def _decode(section: Section, deadline: float, problems: list[str],
            stop: Callable[[], bool] = _never) -> list[tuple[int, int, Program]]:
    """(start, end, rows) of every FDE with a non-empty range, decoded until the first fault, sorted."""
    runner = ProgramRunner()
    fdes = []
    try:
        count = work = 0
        for fde in read_fdes(section):
            count += 1
            work += FDE_WORK + len(fde.program)
            if work >= CHECK_WORK:
                work = 0
                if time.thread_time() > deadline:
                    raise DwarfError(f"over its CPU time budget after {count} FDEs")
                if stop():
                    raise DwarfError(f"stopped after {count} FDEs: the session is ending")
            if fde.end <= fde.start:
                continue
            try:
                program = runner.rows(fde.cie, fde.program)
            except DwarfError as err:
                problems.append(f"FDE at {fde.start:#x}: {err}")
                program = UNSUPPORTED_PROGRAM
            fdes.append((fde.start, fde.end, program))
    except DwarfError as err:
        problems.append(str(err))
    fdes.sort(key=lambda fde: fde[0])
    return fdes


def _assemble(fdes: list[tuple[int, int, Program]], problems: list[str]) -> tuple[array, list[Rule]]:
    """The rows of the FDEs (sorted by start) as pcs and rules: CFA_END in gaps and after the last one,
    a later FDE overlapping an earlier one cuts it, identical consecutive rules merged. The pcs are an
    array of u64 (a list of ints would be 4 times as large: cc1's 0.48 M rows took 17 MB that way); every
    pc is below an FDE's end, which is a u64."""
    pcs = array("Q")
    rules: list[Rule] = []
    prev_end = -1
    for start, end, program in fdes:
        if start > prev_end >= 0:
            add_row(pcs, rules, prev_end, END)
        if start >= prev_end and not program.expand_plt and program.offsets[-1] < end - start:
            _extend(pcs, rules, start, program)
        else:
            _add_rows(pcs, rules, start, end, program)
        prev_end = end
        if len(pcs) > MAX_ROWS:
            problems.append(f"more than {MAX_ROWS} rows")
            del pcs[MAX_ROWS:], rules[MAX_ROWS:]
            return pcs, rules
    if prev_end >= 0:
        add_row(pcs, rules, prev_end, END)
    return pcs, rules


def _extend(pcs: array, rules: list[Rule], start: int, program: Program) -> None:
    """The common case: an FDE after the previous one's end, all its rows inside it, no PLT to write out.
    Its merged rows go in as they are (every pc so far is below ``start``), the first one merged with the
    rule before it."""
    first = 1 if rules and rules[-1] == program.rules[0] else 0
    pcs.extend(map(start.__add__, islice(program.offsets, first, None)))
    rules.extend(islice(program.rules, first, None))


def _add_rows(pcs: array, rules: list[Rule], start: int, end: int, program: Program) -> None:
    """An FDE's rows one by one: cutting the rows of an earlier FDE it overlaps, stopping at its end,
    writing out PLT rules."""
    while pcs and pcs[-1] >= start:
        pcs.pop()
        rules.pop()
    offsets = program.offsets
    for index, (offset, rule) in enumerate(zip(offsets, program.rules)):
        pc = start + offset
        if pc >= end:
            break
        if rule.cfa_type == PLT_EXPAND:
            limit = min(end, start + offsets[index + 1]) if index + 1 < len(offsets) else end
            _expand_plt(pcs, rules, pc, limit, rule)
        else:
            add_row(pcs, rules, pc, rule)


def _expand_plt(pcs: array, rules: list[Rule], pc: int, limit: int, rule: Rule) -> None:
    """CFA = rsp + N + ((pc & 15) >= K) * 8 over [pc, limit) as explicit rows (K in rule.rbp_offset)."""
    if (limit - pc) // 16 > MAX_PLT_ENTRIES:
        add_row(pcs, rules, pc, UNSUPPORTED)
        return
    low, high = Rule(CFA_RSP, rule.cfa_offset, RBP_SAME, 0), Rule(CFA_RSP, rule.cfa_offset + 8, RBP_SAME, 0)
    threshold = rule.rbp_offset
    add_row(pcs, rules, pc, high if pc & 15 >= threshold else low)
    for entry in range(pc & ~15, limit, 16):
        for at, entry_rule in ((entry, low), (entry + threshold, high)):
            if pc < at < limit:
                add_row(pcs, rules, at, entry_rule)
