"""CPython's perf trampoline arenas (frontend/unwind/trampolines.py): the rows follow the copies wherever
they are laid, end to end (3.12) or every 16 bytes (3.13)."""
from __future__ import annotations

from optrace.frontend.unwind.row import CFA_END, CFA_RSP
from optrace.frontend.unwind.table import UnwindTable
from optrace.frontend.unwind.trampolines import TRAMPOLINE, arena_rows, stride


def table(rows: bytes) -> UnwindTable:
    return UnwindTable(rows, len(rows) // 16, "", 0)


def test_the_stride_is_where_the_second_copy_starts():
    assert stride(TRAMPOLINE * 4) == len(TRAMPOLINE)
    padded = (TRAMPOLINE + bytes(16 - len(TRAMPOLINE))) * 4
    assert stride(padded) == 16
    assert stride(TRAMPOLINE + bytes(100)) == len(TRAMPOLINE)  # one copy: the code's own length


def test_every_copy_of_a_padded_arena_has_the_trampolines_rules():
    rows = table(arena_rows(4096, 16))
    for copy in (0, 1, 100, 255):
        base = copy * 16
        assert rows.find(base).cfa_offset == 8 and rows.find(base + 4).cfa_offset == 16  # inside: after the call
        assert rows.find(base + 10) == rows.find(base).__class__(CFA_RSP, 8, 0, 0)
        assert rows.find(base + 12).cfa_type == CFA_END  # padding: no code runs there
    assert rows.find(4096).cfa_type == CFA_END


def test_3_12_stride_on_a_3_13_arena_drifts():
    """The rules a 3.13 arena got before: most copies' return addresses had the rule of another instruction."""
    drifted = table(arena_rows(4096))
    wrong = sum(drifted.find(copy * 16 + 10).cfa_offset != 8 for copy in range(256))
    assert wrong > 128
