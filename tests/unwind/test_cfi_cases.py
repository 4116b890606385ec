"""The CFI cases real files seldom show, on hand-made sections: every rule the walker gets, the PLT
patterns, .debug_frame's own layout (CIE id 0xffffffff, 64-bit DWARF, version 4), pointer encodings."""
from __future__ import annotations

import struct

from cfibytes import CIE_INITIAL, SECTION_ADDR, EhFrame, elf, sleb, uleb

from optrace.frontend.unwind.table import (CFA_END, CFA_OUTERMOST, CFA_PLT, CFA_RBP, CFA_RSP, CFA_UNSUPPORTED, EMPTY,
                                           RBP_AT_CFA, RBP_SAME, RBP_UNSUPPORTED, ROW, Rule, build_table)

PC = 0x1000
PLT_EXPRESSION = bytes([0x77, 8, 0x80, 0, 0x3F, 0x1A, 0x3B, 0x2A, 0x33, 0x24, 0x22])  # binutils' lazy .plt
IBT_PLT_EXPRESSION = PLT_EXPRESSION[:6] + bytes([0x3A]) + PLT_EXPRESSION[7:]  # DW_OP_lit10
ADVANCE = 0x40  # DW_CFA_advance_loc | delta


def one_fde(program: bytes, size: int = 0x40, **cie) -> list[tuple[int, Rule]]:
    frame = EhFrame()
    frame.fde(frame.cie(**cie), PC, size, program)
    table = build_table(elf({".eh_frame": frame.bytes()}))
    assert table.problems == 0, table.problem
    return list(table)


def rsp(offset: int, rbp: int | None = None) -> Rule:
    return Rule(CFA_RSP, offset, RBP_SAME, 0) if rbp is None else Rule(CFA_RSP, offset, RBP_AT_CFA, rbp)


def test_prologue_epilogue_with_remember_restore_state():
    program = bytes([ADVANCE | 1, 0x0E, 16, 0x86, 2,  # push rbp: CFA rsp+16, rbp at CFA-16
                     ADVANCE | 3, 0x0D, 6,  # mov rsp, rbp: CFA rbp+16
                     ADVANCE | 8, 0x0A, 0x0C, 7, 8, 0xC6,  # remember; leave: CFA rsp+8, restore rbp
                     ADVANCE | 1, 0x0B])  # restore_state: back to rbp+16
    assert one_fde(program) == [
        (PC, rsp(8)), (PC + 1, rsp(16, -16)), (PC + 4, Rule(CFA_RBP, 16, RBP_AT_CFA, -16)), (PC + 12, rsp(8)),
        (PC + 13, Rule(CFA_RBP, 16, RBP_AT_CFA, -16)), (PC + 0x40, Rule(CFA_END, 0, RBP_SAME, 0))]


def test_extended_and_factored_forms():
    program = bytes([0x05, 6, 3,  # offset_extended rbp, 3 * -8
                     ADVANCE | 2, 0x12, 7, *sleb(-3),  # def_cfa_sf rsp, -3 * -8 = 24
                     ADVANCE | 2, 0x13, *sleb(-4),  # def_cfa_offset_sf: 32
                     ADVANCE | 2, 0x11, 6, *sleb(-2),  # offset_extended_sf rbp: 16
                     ADVANCE | 2, 0x2F, 6, 1,  # GNU_negative_offset_extended rbp: +8
                     ADVANCE | 2, 0x06, 6,  # restore_extended rbp
                     0x2E, 5, 0x00,  # GNU_args_size, nop
                     0x02, 3, 0x0E, 40,  # advance_loc1
                     0x03, *struct.pack("<H", 3), 0x0E, 48,  # advance_loc2
                     0x04, *struct.pack("<I", 3), 0x0E, 56])  # advance_loc4
    assert [rule for _, rule in one_fde(program)] == [
        rsp(8, -24), rsp(24, -24), rsp(32, -24), rsp(32, 16), rsp(32, 8), rsp(32), rsp(40), rsp(48), rsp(56),
        Rule(CFA_END, 0, RBP_SAME, 0)]


def test_rules_the_walker_must_not_guess():
    program = bytes([ADVANCE | 1, 0x10, 6, 2, 0x76, 0,  # expression rbp: DW_OP_breg6 0
                     ADVANCE | 1, 0x08, 6,  # same_value rbp
                     ADVANCE | 1, 0x14, 6, 1,  # val_offset rbp
                     ADVANCE | 1, 0x09, 6, 3,  # register rbp = rbx
                     ADVANCE | 1, 0x08, 6, 0x0F, 2, 0x77, 0,  # def_cfa_expression (not the PLT's)
                     ADVANCE | 1, 0x0C, 10, 0,  # def_cfa r10
                     ADVANCE | 1, 0x0C, 7, 8, 0x90, 2,  # return address at CFA-16
                     ADVANCE | 1, 0x90, 1, 0x07, 16])  # return address undefined (_start)
    assert [rule for _, rule in one_fde(program)] == [
        rsp(8), Rule(CFA_RSP, 8, RBP_UNSUPPORTED, 0), rsp(8), Rule(CFA_RSP, 8, RBP_UNSUPPORTED, 0),
        Rule(CFA_UNSUPPORTED, 0, RBP_SAME, 0), Rule(CFA_OUTERMOST, 0, RBP_SAME, 0), Rule(CFA_END, 0, RBP_SAME, 0)]


def test_cie_with_another_return_address_column_is_unsupported():
    assert [rule.cfa_type for _, rule in one_fde(b"", ra=15)] == [CFA_UNSUPPORTED, CFA_END]


def test_lazy_plt_expression_is_cfa_plt():
    program = bytes([0x0E, 16, ADVANCE | 6, 0x0E, 24, ADVANCE | 10, 0x0F, len(PLT_EXPRESSION), *PLT_EXPRESSION])
    rows = one_fde(program, size=0x40)
    assert rows == [(PC, rsp(16)), (PC + 6, rsp(24)), (PC + 16, Rule(CFA_PLT, 8, RBP_SAME, 0)),
                    (PC + 0x40, Rule(CFA_END, 0, RBP_SAME, 0))]


def test_ibt_plt_expression_is_written_out_per_entry():
    """DW_OP_lit10: CFA = rsp + 8 + ((pc & 15) >= 10) * 8, as rows every 16 bytes."""
    rows = one_fde(bytes([0x0F, len(IBT_PLT_EXPRESSION), *IBT_PLT_EXPRESSION]), size=0x30)
    expected = []
    for entry in range(PC, PC + 0x30, 16):
        expected += [(entry, rsp(8)), (entry + 10, rsp(16))]
    assert rows == expected + [(PC + 0x30, Rule(CFA_END, 0, RBP_SAME, 0))]


def test_gaps_overlaps_and_merged_rows():
    frame = EhFrame()
    cie = frame.cie()
    frame.fde(cie, PC + 0x100, 0x10)  # out of order: sorted by pc
    frame.fde(cie, PC, 0x10, bytes([ADVANCE | 4, 0x0E, 16]))
    frame.fde(cie, PC + 0x10, 0x10)  # adjacent, same rule as the first row: no END between
    frame.fde(cie, PC + 0x120, 0)  # empty: ignored
    table = build_table(elf({".eh_frame": frame.bytes()}))
    assert [(pc, rule.cfa_type, rule.cfa_offset) for pc, rule in table] == [
        (PC, CFA_RSP, 8), (PC + 4, CFA_RSP, 16), (PC + 0x10, CFA_RSP, 8), (PC + 0x20, CFA_END, 0),
        (PC + 0x100, CFA_RSP, 8), (PC + 0x110, CFA_END, 0)]
    assert table.find(PC - 1) is None and table.find(PC + 0x50).cfa_type == CFA_END
    assert len(table.rows) == table.count * ROW.size == 6 * 16
    assert list(table.pcs()) == [pc for pc, _ in table]


def test_zplr_augmentation_and_pointer_encodings():
    """A C++-style CIE ("zPLR": personality as indirect pcrel sdata4, LSDA encoding), FDEs with LSDA
    pointers in their augmentation data; and a "zR" CIE with udata4 absolute pointers."""
    frame = EhFrame()
    aug = bytes([0x9B]) + struct.pack("<i", 0x100) + bytes([0x1B, 0x1B])  # P: indirect|pcrel|sdata4, L, R
    cie = frame.cie(augmentation=b"zPLR", aug_data=aug)
    at = len(frame.data)
    head = struct.pack("<Ii", at + 4 - cie, PC - (SECTION_ADDR + at + 8)) + struct.pack("<i", 0x20)
    frame.raw(head + uleb(4) + struct.pack("<i", 0x40) + bytes([ADVANCE | 1, 0x0E, 16]))
    absolute = frame.cie(aug_data=bytes([0x03]))  # udata4
    at = len(frame.data)
    frame.raw(struct.pack("<II", at + 4 - absolute, PC + 0x20) + struct.pack("<I", 0x10) + uleb(0))
    table = build_table(elf({".eh_frame": frame.bytes()}))
    assert table.problems == 0, table.problem
    assert [(pc, rule.cfa_offset) for pc, rule in table] == [(PC, 8), (PC + 1, 16), (PC + 0x20, 8), (PC + 0x30, 0)]


def debug_frame(dwarf64: bool, version: int) -> bytes:
    """A .debug_frame with one CIE and one FDE (absolute 8-byte addresses), 32- or 64-bit DWARF."""
    def entry(body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 8)
        return (b"\xff\xff\xff\xff" + struct.pack("<Q", len(body))) if dwarf64 else struct.pack("<I", len(body))

    cie_id = b"\xff" * (8 if dwarf64 else 4)
    extra = bytes([8, 0]) if version == 4 else b""
    ra = bytes([16]) if version == 1 else uleb(16)
    cie_body = cie_id + bytes([version]) + b"\0" + extra + uleb(1) + sleb(-8) + ra + CIE_INITIAL
    cie = entry(cie_body) + cie_body + b"\0" * (-len(cie_body) % 8)
    pointer = struct.pack("<Q", 0) if dwarf64 else struct.pack("<I", 0)
    fde_body = pointer + struct.pack("<QQ", PC, 0x20) + bytes([ADVANCE | 1, 0x0E, 16, 0x86, 2])
    return cie + entry(fde_body) + fde_body + b"\0" * (-len(fde_body) % 8)


def test_debug_frame_layouts():
    for dwarf64 in (False, True):
        for version in (1, 3, 4):
            table = build_table(elf({".debug_frame": debug_frame(dwarf64, version)}, addresses={}))
            assert table.source == ".debug_frame" and table.problems == 0, (dwarf64, version, table.problem)
            assert list(table) == [(PC, rsp(8)), (PC + 1, rsp(16, -16)), (PC + 0x20, Rule(CFA_END, 0, RBP_SAME, 0))]


def test_nobits_eh_frame_falls_back_to_debug_frame():
    data = elf({".eh_frame": b"", ".debug_frame": debug_frame(False, 1)}, nobits=(".eh_frame",))
    assert build_table(data).source == ".debug_frame"


def test_no_cfi_at_all_is_the_empty_table():
    assert build_table(elf({".text": b"\xc3"})) is EMPTY
