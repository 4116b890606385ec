"""Line decoding (frontend/runtimes/cpython/linetable.py) against the interpreters themselves: for every code unit of
code objects of each CPython, the line PyCode_Addr2Line gives (tests/python/programs/lines.py) must be the
decoder's, from the same raw co_lnotab / co_linetable bytes; a table cut short never gives a wrong line."""
from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from optrace.frontend.runtimes.cpython import linetable
from optrace.frontend.runtimes.cpython.codeobject import CodeInfo
from optrace.frontend.runtimes.cpython.linetable import line_of
from optrace.pythonlayout import LINES_310, LINES_LNOTAB, LINES_LOCATIONS
from pythons import PROGRAMS, SUPPORTED, command

KINDS = {"3.8": LINES_LNOTAB, "3.9": LINES_LNOTAB, "3.10": LINES_310}


def interpreter_lines(name: str) -> list[dict]:
    out = subprocess.run([*command(name), str(PROGRAMS / "lines.py")], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("name", SUPPORTED)
def test_lines_are_the_interpreters(name):
    kind = KINDS.get(name, LINES_LOCATIONS)
    codes = interpreter_lines(name)
    assert len(codes) > 20 and any(code["firstlineno"] > 70000 for code in codes)
    checked = 0
    for code in codes:
        table = bytes.fromhex(code["table"])
        for unit, expected in enumerate(code["lines"]):
            found = line_of(kind, table, code["firstlineno"], unit)
            assert found == (None if expected < 0 else expected), (code["name"], unit)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("name", ["3.9", "3.10", "3.11"])
def test_a_cut_table_gives_the_right_line_or_none(name):
    kind = KINDS.get(name, LINES_LOCATIONS)
    for code in interpreter_lines(name):
        table = bytes.fromhex(code["table"])
        for cut in {len(table) // 3, len(table) // 2, len(table) - 1}:
            known = 0
            for unit, expected in enumerate(code["lines"]):
                found = line_of(kind, table[:max(cut, 0)], code["firstlineno"], unit, complete=False)
                assert found in (None, None if expected < 0 else expected), (code["name"], unit, cut)
                known += found is not None
            assert cut < 4 or known or not any(line >= 0 for line in code["lines"])


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([LINES_LNOTAB, LINES_310, LINES_LOCATIONS, "nonsense"]), st.binary(max_size=600),
       st.integers(-(1 << 31), 1 << 31), st.integers(-5, 1 << 16), st.booleans())
def test_garbage_tables_never_raise(kind, table, firstlineno, unit, complete):
    found = line_of(kind, table, firstlineno, unit, complete)
    assert found is None or isinstance(found, int)


@pytest.mark.parametrize("name", SUPPORTED[-1:])
def test_a_code_objects_table_is_decoded_once(name, monkeypatch):
    """CodeInfo.line gives the decoder's line for every unit, asked once or again, from the table decoded once
    (its ranges bounded by the table's bytes): a walk of the table per instruction asked made a generated
    code object's frames cost minutes to name."""
    code = next(c for c in interpreter_lines(name) if len(c["lines"]) > 10)
    kind = KINDS.get(name, LINES_LOCATIONS)
    info = CodeInfo("f", "f", "f.py", code["firstlineno"], bytes.fromhex(code["table"]), True, kind)
    expected = [line_of(kind, info.linetable, info.firstlineno, unit) or 0 for unit in range(len(code["lines"]))]
    decodes = []
    monkeypatch.setattr(linetable, "_locations_ranges", spy(linetable._locations_ranges, decodes))
    for _ in range(2):
        assert [info.line(unit) for unit in range(len(code["lines"]))] == expected
    for unit in range(10_000):
        info.line(unit)
    assert len(decodes) <= 1 and len(info._index[0]._ends) <= len(info.linetable)


def spy(function, calls: list):
    def wrapped(*args):
        calls.append(args)
        return function(*args)
    return wrapped
