"""`readelf --debug-dump=frames-interp` as the reference for unwind tables: its rows, per FDE, as the
rule a table row must hold (imported by name: tests/unwind is put on sys.path by conftest.py)."""
from __future__ import annotations

import bisect
import re
import subprocess
from dataclasses import dataclass

from optrace.frontend.unwind.table import (CFA_OUTERMOST, CFA_PLT, CFA_RBP, CFA_RSP, CFA_UNSUPPORTED, RBP_AT_CFA, RBP_SAME,
                                           RBP_UNSUPPORTED, Rule)

EXPRESSION = "exp"  # a CFA expression: the PLT's (CFA_PLT) or one the walker refuses (CFA_UNSUPPORTED)

_SECTION = re.compile(r"^Contents of the (\S+) section")
_CIE = re.compile(r"^([0-9a-f]{8,16}) [0-9a-f]+ [0-9a-f]+ CIE")
_FDE = re.compile(r"^[0-9a-f]{8,16} [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)")
_ROW = re.compile(r"^([0-9a-f]{16}) (.*)$")
_CELL = re.compile(r"\S+(?: \(\w+\))?")  # "c-16", "exp", "r10 (r10)"


@dataclass
class ReadelfFde:
    start: int
    end: int
    rows: list[tuple[int, Rule | str]]  # (pc, rule or EXPRESSION), sorted


def frames(path: str) -> dict[str, list[ReadelfFde]]:
    """Per section (".eh_frame", ".debug_frame"), the FDEs readelf decodes, with their rows."""
    # readelf exits 1 on Debian's libc.so.6 without a word on stderr, having printed every frame
    done = subprocess.run(["readelf", "--debug-dump=frames-interp", "-W", path], capture_output=True, text=True)
    text = done.stdout
    assert done.returncode in (0, 1) and "Contents of the" in text, done.stderr
    sections: dict[str, list[ReadelfFde]] = {}
    cie_rows: dict[int, Rule | str] = {}
    fdes: list[ReadelfFde] = []
    columns: list[str] = []
    current: ReadelfFde | None = None
    in_cie: int | None = None
    for line in text.splitlines():
        if match := _SECTION.match(line):
            fdes = sections.setdefault(match.group(1).rstrip(":"), [])
            cie_rows, current, in_cie = {}, None, None
        elif match := _CIE.match(line):
            in_cie, current = int(match.group(1), 16), None
        elif match := _FDE.match(line):
            start, end = int(match.group(2), 16), int(match.group(3), 16)
            current, in_cie = ReadelfFde(start, end, []), None
            cie_initial = cie_rows.get(int(match.group(1), 16))
            if cie_initial is not None:
                current.rows.append((start, cie_initial))  # replaced when readelf prints rows
            fdes.append(current)
        elif line.strip().startswith("LOC"):
            columns = line.split()[1:]
        elif (match := _ROW.match(line)) and (current is not None or in_cie is not None):
            rule = expected_rule(dict(zip(columns, _CELL.findall(match.group(2)))))
            if in_cie is not None:
                cie_rows[in_cie] = rule
            else:
                pc = int(match.group(1), 16)
                if current.rows and current.rows[-1][0] == pc:  # the CIE's row, or two rows at one pc
                    current.rows.pop()
                current.rows.append((pc, rule))
    return sections


def expected_rule(cells: dict[str, str]) -> Rule | str:
    """The table rule for one readelf row (its cells by column name: CFA, rbp, ra, ...)."""
    ra = cells.get("ra", "u")
    if ra == "u":
        return Rule(CFA_OUTERMOST, 0, RBP_SAME, 0)
    cfa = cells["CFA"]
    if cfa == "exp":
        return EXPRESSION
    match = re.fullmatch(r"(rsp|rbp)([+-]\d+)", cfa)
    if ra != "c-8" or not match:
        return Rule(CFA_UNSUPPORTED, 0, RBP_SAME, 0)
    cfa_type, offset = (CFA_RSP if match.group(1) == "rsp" else CFA_RBP), int(match.group(2))
    rbp = cells.get("rbp", "u")
    if rbp in ("u", "s"):
        return Rule(cfa_type, offset, RBP_SAME, 0)
    if saved := re.fullmatch(r"c([+-]\d+)", rbp):
        return Rule(cfa_type, offset, RBP_AT_CFA, int(saved.group(1)))
    return Rule(cfa_type, offset, RBP_UNSUPPORTED, 0)


def ranges(fdes: list[ReadelfFde]) -> list[tuple[int, int, Rule | str]]:
    """(first pc, last pc, rule) of every row readelf lists, in the table's terms."""
    found = []
    for fde in fdes:
        rows = [row for row in fde.rows if fde.start <= row[0] < fde.end]
        for index, (pc, rule) in enumerate(rows):
            end = rows[index + 1][0] if index + 1 < len(rows) else fde.end
            if end > pc:
                found.append((pc, end - 1, rule))
    return found


def plt_sections(path: str) -> list[tuple[int, int]]:
    """[start, end) of the file's .plt* sections (pyelftools)."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as stream:
        return [(s["sh_addr"], s["sh_addr"] + s["sh_size"]) for s in ELFFile(stream).iter_sections()
                if s.name.startswith(".plt")]


def matches(got: Rule | None, want: Rule | str, pc: int, plts: list[tuple[int, int]]) -> bool:
    """Whether the table's rule at ``pc`` is readelf's: an expression is CFA_PLT (or written-out PLT
    rows) inside a .plt section, else CFA_UNSUPPORTED."""
    if got is None:
        return False
    if want != EXPRESSION:
        return got == want
    in_plt = any(low <= pc < high for low, high in plts)
    plt = got.cfa_type == CFA_PLT and got.cfa_offset == 8 or got.cfa_type == CFA_RSP and got.cfa_offset in (8, 16)
    return (in_plt and plt) or got.cfa_type == CFA_UNSUPPORTED


class Expected:
    """readelf's rule at any pc of one file (None outside every FDE)."""

    def __init__(self, path: str) -> None:
        listed = frames(path)
        fdes = listed.get(".eh_frame") or listed.get(".debug_frame") or []
        self.ranges = sorted(ranges(fdes))
        self._firsts = [first for first, _, _ in self.ranges]
        self.plts = plt_sections(path)

    def at(self, pc: int) -> Rule | str | None:
        index = bisect.bisect_right(self._firsts, pc) - 1
        if index >= 0 and pc <= self.ranges[index][1]:
            return self.ranges[index][2]
        return None
