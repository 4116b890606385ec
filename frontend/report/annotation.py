"""`optrace annotate`'s model: a recorded function's instructions with the share of its own samples on
each, like `perf annotate` (percent of the function's samples, so the column sums to 100).

Everything comes from the record (:class:`~optrace.model.FunctionCode`): the code bytes and the leaf
offsets `record` kept, so neither root nor the binary is needed. The record may come from someone else:
a function whose code is too large, whose hits fall outside its code or whose architecture is unknown is
skipped with a warning, never trusted.
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import capstone

from optrace.errors import OptraceError
from optrace.escape import escape_controls
from optrace.frontend.report.sourceannotation import SourceAnnotation, sound_entries
from optrace.model import FunctionCode, RuntimeSource, Record

MAX_CODE_BYTES = 1 << 20  # one function's bytes read from a record (record keeps at most 64 KiB)
MAX_HITS = 1 << 20  # distinct offsets of one function
MAX_LINES = 1 << 16  # source-line rows of one function (record keeps at most 4096)
SYNTAXES = ("att", "intel")


@dataclass(frozen=True)
class AnnotateOptions:
    symbol: str | None = None
    dsos: frozenset[str] = frozenset()
    pids: frozenset[int] = frozenset()
    syntax: str = "att"
    source_lines: bool = False  # -l
    color: bool = False  # highlight the hottest lines (a terminal)


@dataclass(frozen=True)
class Instruction:
    address: int
    size: int
    text: str  # mnemonic and operands
    samples: int
    percent: float  # of the function's samples
    source: str | None = None  # "file:line" where this instruction starts a new source line (-l)


@dataclass(frozen=True)
class LineShare:
    """A source line's share of the function's samples (-l's summary)."""

    source: str
    samples: int
    percent: float


@dataclass
class Annotation:
    """One function (its entries of every selected process merged: same code, hits summed)."""

    symbol: str
    dso: str
    start: int
    samples: int
    syntax: str
    instructions: list[Instruction] = field(default_factory=list)
    truncated: bool = False
    pids: tuple[int, ...] = ()
    lines: list[LineShare] | None = None  # with -l: the source lines, hottest first ([]: none recorded)


@dataclass(frozen=True)
class Listed:
    """A line of `annotate` without a symbol: an annotatable function and its samples."""

    symbol: str
    dso: str
    samples: int
    percent: float  # of the record's samples


def functions_of(record: Record, skipped: dict[str, str]) -> list[FunctionCode]:
    """The record's kept functions that are sound; the others go to ``skipped`` (symbol -> problem).
    A record from before `record` kept code is refused in one line."""
    if record.functions is None:
        raise OptraceError("this record holds no code (recorded before optrace kept it for annotate): re-record it")
    return sound_entries(record.functions, _problem, skipped)


def _problem(function: FunctionCode) -> str | None:
    if function.arch != "x86_64":
        return f"code for {escape_controls(function.arch)[:40]} cannot be disassembled here"
    if not 0 < len(function.code) <= MAX_CODE_BYTES:
        return f"{len(function.code)} bytes of code (expected 1 to {MAX_CODE_BYTES})"
    if len(function.hits) > MAX_HITS or any(not 0 <= offset < len(function.code) for offset in function.hits):
        return "sample offsets outside its code"
    if len(function.lines) > MAX_LINES or any(not 0 <= line.offset < len(function.code) for line in function.lines):
        return "source lines outside its code"
    if function.start + len(function.code) > 1 << 64:
        return "its code ends past the address space"
    return None


def selected(functions: Iterable[FunctionCode], options: AnnotateOptions) -> list[FunctionCode]:
    return [f for f in functions if _dso_selected(f.dso, options) and (not options.pids or f.pid in options.pids)]


def selected_sources(sources: Iterable[RuntimeSource], options: AnnotateOptions) -> list[RuntimeSource]:
    return [s for s in sources if _dso_selected(s.file, options) and (not options.pids or s.pid in options.pids)]


def _dso_selected(dso: str, options: AnnotateOptions) -> bool:
    return (not options.dsos or dso in options.dsos or os.path.basename(dso) in options.dsos
            or dso.removeprefix("[jit] ") in options.dsos)


def listing(record: Record, functions: list[FunctionCode], sources: Iterable[RuntimeSource] = ()) -> list[Listed]:
    """One line per function (processes merged), most samples first; Python functions with their file."""
    total = sum(sample.count for sample in record.samples)
    merged: dict[tuple[str, str], int] = {}
    for function in functions:
        key = (function.symbol, function.dso)
        merged[key] = merged.get(key, 0) + sum(function.hits.values())
    for source in sources:
        key = (source.symbol, source.file)
        merged[key] = merged.get(key, 0) + sum(source.hits.values())
    rows = [Listed(symbol, dso, n, round(100.0 * n / total, 2) if total else 0.0)
            for (symbol, dso), n in merged.items()]
    rows.sort(key=lambda row: (-row.samples, row.symbol))
    return rows


def find(functions: list[FunctionCode], symbol: str, skipped: dict[str, str] | None = None,
         other_names: Iterable[str] = (), seen: Mapping[int, int] | None = None) -> list[FunctionCode]:
    """The entries of ``symbol`` holding the most samples (one function: same object and start); an
    unknown symbol is one line naming the closest ones (``other_names`` too: the Python functions kept), a
    skipped one a line saying why. ``seen``: the processes whose stacks hold ``symbol`` (pid -> samples, see
    :func:`seen_in`): the closest names are theirs (``other_names`` then has only theirs too)."""
    matching = [f for f in functions if f.symbol == symbol]
    if not matching and skipped and symbol in skipped:
        raise OptraceError(f"{escape_controls(symbol)[:120]} cannot be annotated: the record is corrupt "
                           f"({skipped[symbol]})")
    if not matching:
        raise OptraceError(_not_found(symbol, {f.symbol for f in functions if not seen or f.pid in seen}
                                      | set(other_names), seen or {}))
    groups: dict[tuple, list[FunctionCode]] = {}
    for function in matching:
        groups.setdefault((function.dso, function.build_id, function.start, function.code), []).append(function)
    return max(groups.values(), key=lambda group: sum(sum(f.hits.values()) for f in group))


def seen_in(record: Record, symbol: str) -> dict[int, int]:
    """The processes whose samples' stacks hold a frame named ``symbol``, with those samples."""
    named = {i for i, frame in enumerate(record.frames) if frame.symbol == symbol}
    seen: dict[int, int] = {}
    for sample in record.samples if named else ():
        if not named.isdisjoint(sample.frames):
            seen[sample.pid] = seen.get(sample.pid, 0) + sample.count
    return seen


def _not_found(symbol: str, names: Iterable[str], seen: Mapping[int, int]) -> str:
    names = sorted(names)
    close = difflib.get_close_matches(symbol, names, n=3, cutoff=0.5)
    close += [name for name in names if symbol in name and name not in close][:3 - len(close)]
    shown = escape_controls(symbol)[:120]
    if seen:
        processes = ", ".join(f"pid {pid}" for pid in sorted(seen)[:3]) + (" ..." if len(seen) > 3 else "")
        where = (f"; it is in {sum(seen.values())} samples' stacks ({processes}), but record kept neither its code"
                 f" nor its source (only the hottest functions')")
        hint = f"; did you mean {', '.join(escape_controls(n)[:120] for n in close)} (same process)?" if close else ""
        return f"no annotatable function {shown} in the record{where}{hint}"
    hint = f"; did you mean {', '.join(escape_controls(n)[:120] for n in close)}?" if close else \
        ("; optrace annotate without a symbol lists them" if names else "; the record kept no function's code")
    return f"no annotatable function {shown} in the record{hint}"


def annotate(entries: list[FunctionCode], syntax: str = "att", source_lines: bool = False) -> Annotation:
    """Disassemble the code (bytes capstone cannot decode are shown as data) and put the hits on the
    instruction holding each sampled offset."""
    first = entries[0]
    hits: dict[int, int] = {}
    for entry in entries:
        for offset, count in entry.hits.items():
            hits[offset] = hits.get(offset, 0) + count
    total = sum(hits.values())
    result = Annotation(first.symbol, first.dso, first.start, total, syntax,
                        truncated=any(e.truncated for e in entries), pids=tuple(sorted({e.pid for e in entries})))
    offsets = sorted(hits)
    lines = sorted(first.lines, key=lambda line: line.offset) if source_lines else []
    cursor = line_cursor = 0
    current: str | None = None
    per_line: dict[str, int] = {}
    for address, size, mnemonic, operands in _decoder(syntax).disasm_lite(first.code, first.start):
        begin = address - first.start
        count = 0
        while cursor < len(offsets) and offsets[cursor] < begin + size:
            count += hits[offsets[cursor]]
            cursor += 1
        started = None
        while line_cursor < len(lines) and lines[line_cursor].offset < begin + size:
            line = lines[line_cursor]
            started = f"{line.file}:{line.line}"
            line_cursor += 1
        if started is not None and started != current:
            current = started
        else:
            started = None
        if current is not None:
            per_line[current] = per_line.get(current, 0) + count
        text = f"{mnemonic:<6} {operands}".rstrip()
        result.instructions.append(Instruction(address, size, text, count, _percent(count, total), started))
    if source_lines:
        result.lines = sorted((LineShare(source, n, _percent(n, total)) for source, n in per_line.items()),
                              key=lambda line: (-line.samples, line.source))
    return result


def _percent(count: int, total: int) -> float:
    return round(100.0 * count / total, 4) if total else 0.0


def _decoder(syntax: str) -> capstone.Cs:
    decoder = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    decoder.skipdata = True  # undecodable bytes become ".byte" lines: every offset lies in some line
    if syntax == "intel":
        decoder.syntax = capstone.CS_OPT_SYNTAX_INTEL
    else:
        decoder.syntax = capstone.CS_OPT_SYNTAX_ATT
    return decoder


@dataclass(frozen=True)
class AnnotateView:
    """What `annotate` prints: one function's annotation, or (no symbol given) the annotatable list."""

    source: str  # the record's name as shown
    annotation: Annotation | None = None
    listing: list[Listed] | None = None
    python: SourceAnnotation | None = None  # a Python function's source lines


HOT_PERCENT = 5.0  # perf annotate's colours: red above 5 %, green above 0.5 %
WARM_PERCENT = 0.5


def heat(percent: float) -> str:
    """"hot", "warm" or "" for a line's share (perf's thresholds)."""
    return "hot" if percent >= HOT_PERCENT else "warm" if percent >= WARM_PERCENT else ""
