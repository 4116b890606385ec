"""pyelftools, an independent DWARF decoder, as a second reference: at every row pyelftools decodes
from .eh_frame (liblzma, libc, the workload without frame pointers), the table holds the same CFA and
rbp rule; the PLT expressions it shows are the ones mapped to CFA_PLT (threshold 11) or written out."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from elftools.dwarf.callframe import FDE, RegisterRule
from elftools.elf.elffile import ELFFile

from optrace.frontend.unwind.table import (CFA_OUTERMOST, CFA_PLT, CFA_RBP, CFA_RSP, CFA_UNSUPPORTED, RBP_AT_CFA,
                                           RBP_SAME, RBP_UNSUPPORTED, Rule, build_table)

REG_RBP, REG_RSP, REG_RA = 6, 7, 16
PLT_PREFIX = bytes([0x77, 8, 0x80, 0, 0x3F, 0x1A])


def expected(row: dict) -> Rule | tuple[str, int]:
    ra = row.get(REG_RA)
    if ra is None or ra.type == RegisterRule.UNDEFINED:
        return Rule(CFA_OUTERMOST, 0, RBP_SAME, 0)
    cfa = row["cfa"]
    if cfa.expr is not None:
        expr = bytes(cfa.expr)
        return ("plt", expr[6] - 0x30) if expr.startswith(PLT_PREFIX) and len(expr) == 11 else Rule(CFA_UNSUPPORTED, 0, RBP_SAME, 0)
    if ra.type != RegisterRule.OFFSET or ra.arg != -8 or cfa.reg not in (REG_RSP, REG_RBP):
        return Rule(CFA_UNSUPPORTED, 0, RBP_SAME, 0)
    cfa_type = CFA_RSP if cfa.reg == REG_RSP else CFA_RBP
    rbp = row.get(REG_RBP)
    if rbp is None or rbp.type in (RegisterRule.UNDEFINED, RegisterRule.SAME_VALUE):
        return Rule(cfa_type, cfa.offset, RBP_SAME, 0)
    if rbp.type == RegisterRule.OFFSET:
        return Rule(cfa_type, cfa.offset, RBP_AT_CFA, rbp.arg)
    return Rule(cfa_type, cfa.offset, RBP_UNSUPPORTED, 0)


def check_against_pyelftools(path: str) -> int:
    """How many rows were compared (each at its pc and its last byte)."""
    table = build_table(Path(path).read_bytes())
    compared = 0
    with open(path, "rb") as stream:
        for entry in ELFFile(stream).get_dwarf_info(follow_links=False).EH_CFI_entries():
            if not isinstance(entry, FDE):
                continue
            start, end = entry.header.initial_location, entry.header.initial_location + entry.header.address_range
            rows = entry.get_decoded().table
            for index, row in enumerate(rows):
                last = (rows[index + 1]["pc"] if index + 1 < len(rows) else end) - 1
                if last < row["pc"]:
                    continue
                want = expected(row)
                for pc in (row["pc"], last):
                    got = table.find(pc)
                    if isinstance(want, Rule):
                        assert got == want, f"{pc:#x}: pyelftools {want}, table {got}"
                    else:  # CFA = rsp + 8 + ((pc & 15) >= K) * 8
                        effective = got.cfa_offset + (8 if got.cfa_type == CFA_PLT and (pc & 15) >= 11 else 0)
                        assert got.cfa_type in (CFA_PLT, CFA_RSP), hex(pc)
                        assert effective == 8 + 8 * ((pc & 15) >= want[1]), hex(pc)
                compared += 1
    return compared


@pytest.mark.parametrize("path", ["/lib/x86_64-linux-gnu/liblzma.so.5", "/lib/x86_64-linux-gnu/libc.so.6"])
def test_system_library(path: str):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed")
    assert check_against_pyelftools(path) > 3000


def test_workload_without_frame_pointers(omit_fp_binary: Path):
    assert check_against_pyelftools(str(omit_fp_binary)) > 10
