"""What `record` keeps for annotate (frontend/codecapture.py), against stand-in readers (no root, no files):
the source lines of all the kept functions of one object come from one read of its line table, each
function getting the rows of its own code."""
from __future__ import annotations

from optrace.frontend.codecapture import Code, capture
from optrace.frontend.symbols.srcline import LineRow
from optrace.model import Frame, Sample, SourceLine

LIB = "/usr/lib/libbig.so"
BUILD_ID = "ab" * 20
FUNCTIONS = {"alpha": (0x1000, 0x1040), "beta": (0x2000, 0x2020), "gamma": (0x3000, 0x3010)}  # vaddr ranges
FILE_OFFSET = 0x400  # each function's file offset is its vaddr minus this


def native(frame: Frame, max_bytes: int) -> Code:
    start, end = FUNCTIONS[frame.symbol]
    return Code(start, start - FILE_OFFSET, b"\x90" * (end - start), end - start)


def no_jit(pid: int, address: int, name: str) -> None:
    raise AssertionError("no JIT frames here")


def test_one_line_table_read_for_all_functions_of_an_object():
    frames = [Frame(name, LIB, address=start - FILE_OFFSET + 4, build_id=BUILD_ID)
              for name, (start, _) in FUNCTIONS.items()]
    samples = [Sample(1, "p", (i,), 10 * (i + 1)) for i in range(len(frames))]
    calls = []

    def lines(build_id: str, ranges) -> list[LineRow]:
        calls.append((build_id, sorted(ranges)))
        rows = [LineRow(start + step, "/src/big.c", 100 * i + step)
                for i, (start, end) in enumerate(sorted(ranges)) for step in (0, 8)]
        return rows + [LineRow(0x5000, "/src/other.c", 1)]  # outside every function: nobody's

    kept = capture(frames, samples, native, no_jit, lines=lines)
    assert calls == [(BUILD_ID, sorted(FUNCTIONS.values()))]
    by_name = {function.symbol: function.lines for function in kept}
    assert by_name == {name: [SourceLine(0, "/src/big.c", 100 * i), SourceLine(8, "/src/big.c", 100 * i + 8)]
                       for i, name in enumerate(FUNCTIONS)}
