from __future__ import annotations

from optrace.frontend.symbols.symbol import STB_GLOBAL, STB_LOCAL, STB_WEAK, Symbol, SymbolTable


def test_sized_symbol_covers_its_range_only() -> None:
    table = SymbolTable([Symbol(0x100, 0x10, "a"), Symbol(0x200, 0x10, "b")])
    assert [table.find(a) for a in (0xFF, 0x100, 0x10F, 0x110, 0x1FF, 0x200)] == [None, "a", "a", None, None, "b"]


def test_zero_size_symbol_matches_until_next_symbol_unless_sized_one_covers() -> None:
    table = SymbolTable([Symbol(0x100, 0x100, "outer"), Symbol(0x120, 0, "label"), Symbol(0x300, 0, "tail"),
                         Symbol(0x400, 4, "next")])
    assert table.find(0x130) == "outer"  # the sized symbol covers it
    assert table.find(0x250) == "label"  # past the sized one: the zero-size nearest below extends
    assert table.find(0x3FF) == "tail"
    assert table.find(0x404) is None  # nearest below is sized and ends before


def test_nested_sized_symbols() -> None:
    table = SymbolTable([Symbol(0x100, 0x100, "outer"), Symbol(0x140, 0x10, "inner")])
    assert (table.find(0x145), table.find(0x180)) == ("inner", "outer")


def test_alias_choice_like_perf() -> None:
    table = SymbolTable([Symbol(0x100, 8, "__getpid", STB_GLOBAL), Symbol(0x100, 8, "getpid", STB_WEAK),
                         Symbol(0x200, 8, "local_x", STB_LOCAL), Symbol(0x200, 8, "x", STB_GLOBAL),
                         Symbol(0x300, 0, "sizeless", STB_GLOBAL), Symbol(0x300, 4, "sized", STB_LOCAL)])
    assert (table.find(0x100), table.find(0x200), table.find(0x300)) == ("__getpid", "x", "sized")
