"""Resolve a :class:`ProbeSpec` to uprobe targets: (device, inode, file offset) plus printable names.

Symbols come from the object's ELF symbol tables (:mod:`.elf`, which opens it through optrace.fileaccess).
A symbol's value is an ELF virtual address; the kernel wants a file offset, which the PT_LOAD program
header holding the address gives for PIE and non-PIE objects alike. Symbols sharing one address
(``malloc`` / ``__libc_malloc``) are one probe. An address SPEC must be a function start or an instruction
boundary inside a function (:mod:`.address`).
"""
from __future__ import annotations

import difflib
import fnmatch
import os
from dataclasses import dataclass, field

from optrace.fileaccess import BoundedFile, printable
from optrace.errors import OptraceError
from optrace.frontend.symbols.demangle import demangle
from optrace.frontend.uprobes.objects import object_candidates
from optrace.frontend.uprobes.address import check_address
from optrace.frontend.symbols.symbol import Symbol, preferred_alias
from optrace.frontend.uprobes.elf import ElfFunctions, load_functions, open_binary
from optrace.frontend.uprobes.spec import ProbeSpec, parse_spec

DEFAULT_MAX_MATCHES = 1000


@dataclass(frozen=True)
class ProbeKey:
    """What identifies a uprobe in the kernel: the file (device, inode) and the offset in it."""

    dev: int
    ino: int
    offset: int


@dataclass(frozen=True)
class ResolvedProbe:
    spec: str  # the SPEC as the user gave it
    binary: str  # real path of the object
    symbol: str  # printable name; IFUNCs end in " [ifunc resolver]"
    offset: int  # file offset
    key: ProbeKey
    aliases: tuple[str, ...] = ()  # other names at the same address


@dataclass
class Resolution:
    probes: list[ResolvedProbe] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # which file a program or library name was taken as


def _preferred_name(names: list[Symbol], spec: ProbeSpec) -> Symbol:
    """The name to show for an address: the preferred alias (the symbolizer's rule, so `count` and
    `report` name a function alike) among those the SPEC names, so `c:__libc_malloc` shows that name."""
    named = [symbol for symbol in names if _names(symbol, spec)]
    return preferred_alias(named or names)


def readable_names(symbol: Symbol) -> tuple[str, ...]:
    """The names a SPEC may use for a function: as linked (mangled), as `report` prints it (demangled,
    ``demo::Hasher::mix(double)``) and that without its parameters (``demo::Hasher::mix``: every
    overload, as perf probe and bpftrace take C++ names)."""
    readable = demangle(symbol.name)
    if readable == symbol.name:
        return (symbol.name,)
    return (symbol.name, readable, without_parameters(readable))


def without_parameters(readable: str) -> str:
    """``ns::C::f(int) const`` -> ``ns::C::f``: cut at the first ``(`` outside template arguments that is
    not part of an ``operator()`` name."""
    depth = 0
    for at, char in enumerate(readable):
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(0, depth - 1)
        elif char == "(" and depth == 0 and at and not readable[:at].endswith("operator"):
            return readable[:at]
    return readable


def _names(symbol: Symbol, spec: ProbeSpec) -> bool:
    assert spec.symbol is not None
    if spec.is_glob:
        return any(fnmatch.fnmatchcase(name, spec.symbol) for name in readable_names(symbol))
    return spec.symbol in readable_names(symbol)


def _shown_name(symbol: Symbol, spec: ProbeSpec) -> str:
    """The name as linked, unless the SPEC named the function by its readable form: then that form."""
    if spec.symbol == symbol.name or (spec.is_glob and fnmatch.fnmatchcase(symbol.name, spec.symbol or "")):
        return symbol.name
    return demangle(symbol.name)


def _matching(spec: ProbeSpec, elf: ElfFunctions) -> list[Symbol]:
    return [f for f in elf.functions if _names(f, spec)]


def _no_match(spec: ProbeSpec, elf: ElfFunctions, path: str, others: int) -> OptraceError:
    """The error for a SPEC no function matches; names the closest ones (of the first object)."""
    assert spec.symbol is not None
    if others:
        path = f"{path} or the {others} librar{'ies' if others > 1 else 'y'} it loads"
    if spec.is_glob:
        return OptraceError(printable(f"no function in {path} matches '{spec.symbol}'"))
    shown = {name: names[-2] if len(names) > 1 else name  # mangled or readable -> report's readable form
             for names in map(readable_names, elf.functions) for name in names[:2]}
    close = difflib.get_close_matches(spec.symbol, sorted(shown), n=6, cutoff=0.6)
    suggestions = list(dict.fromkeys(shown[name] for name in close))[:3]
    hint = f": did you mean {', '.join(suggestions)}?" if suggestions else ""
    return OptraceError(printable(f"no function '{spec.symbol}' in {path}{hint}"))


def _probes_for_symbols(
    spec: ProbeSpec, elf: ElfFunctions, path: str, st: os.stat_result, found: list[Symbol],
    max_matches: int,
) -> list[ResolvedProbe]:
    at_address: dict[int, list[Symbol]] = {}
    for function in elf.functions:  # aliases at a matched address count as that probe, matched or not
        at_address.setdefault(function.start, []).append(function)
    addresses = sorted({f.start for f in found})
    if len(addresses) > max_matches:
        raise OptraceError(
            f"'{spec.text}' matches {len(addresses)} functions, more than the limit of {max_matches}: "
            "narrow the pattern or raise --max-probes"
        )
    probes = []
    for vaddr in addresses:
        offset = elf.file_offset(vaddr)
        if offset is None:
            continue  # not in an executable segment: nothing a uprobe could hit
        names = at_address[vaddr]
        main = _preferred_name(names, spec)
        shown = _shown_name(main, spec)
        label = f"{shown} [ifunc resolver]" if main.is_ifunc else shown
        probes.append(ResolvedProbe(
            spec=spec.text, binary=path, symbol=label, offset=offset,
            key=ProbeKey(st.st_dev, st.st_ino, offset),
            aliases=tuple(sorted(n.name for n in names if n.name != main.name)),
        ))
    if not probes:
        raise OptraceError(printable(f"'{spec.text}' names no code in an executable segment of {path}"))
    return probes


def _probe_at_address(spec: ProbeSpec, elf: ElfFunctions, binary: BoundedFile, st: os.stat_result) -> ResolvedProbe:
    """A probe at an address the user gave, only if it is a function start or an instruction boundary."""
    assert spec.address is not None
    shown = printable(binary.name)
    offset = elf.file_offset(spec.address)
    if offset is None:
        raise OptraceError(f"address {spec.address:#x} is not in an executable segment of {shown}")
    label = check_address(spec.address, elf, lambda at, size: _read_code(binary, at, size), shown)
    return ResolvedProbe(spec=spec.text, binary=binary.name, symbol=label, offset=offset,
                         key=ProbeKey(st.st_dev, st.st_ino, offset))


def _read_code(binary: BoundedFile, offset: int, size: int) -> bytes:
    try:
        binary.seek(offset)
        code = binary.read(size)
    except OSError as exc:
        raise OptraceError(f"cannot read {printable(binary.name)}: {printable(exc.strerror or exc)}") from None
    if len(code) != size:
        raise OptraceError(f"{printable(binary.name)} is truncated: its code at file offset {offset:#x} is missing")
    return code


def name_list(names: list[str], shown: int = 5) -> str:
    """``a, b, c, d, e and 7 more``: names for a one-line message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def resolve_spec(spec: ProbeSpec, max_matches: int = DEFAULT_MAX_MATCHES, pids: tuple[int, ...] = ()) -> Resolution:
    candidates = object_candidates(spec.obj, pids)
    first: tuple[ElfFunctions, str] | None = None
    for candidate in candidates:
        path = os.path.realpath(candidate.path)
        with open_binary(path) as binary:
            elf = load_functions(binary)
            st = os.fstat(binary.fd)
            if spec.address is not None:
                return Resolution(probes=[_probe_at_address(spec, elf, binary, st)])
        first = first or (elf, path)
        found = _matching(spec, elf)
        if found:
            break
    else:
        assert first is not None
        raise _no_match(spec, *first, len(candidates) - 1)
    probes = _probes_for_symbols(spec, elf, path, st, found, max_matches)
    notes = [printable(f"{spec.text}: {candidate.why}")] if candidate.why else []
    ifuncs = [p.symbol.split(" ")[0] for p in probes if p.symbol.endswith("[ifunc resolver]")]
    warnings = []
    if ifuncs:
        warnings.append(printable(
            f"{name_list(ifuncs)} in {path} {'is an IFUNC' if len(ifuncs) == 1 else 'are IFUNCs'}: the probe counts "
            "calls of the resolver (usually once per process), not of the implementation it selects"
        ))
    return Resolution(probes=probes, warnings=warnings, notes=notes)


def resolve_specs(specs: list[str] | tuple[str, ...], max_matches: int = DEFAULT_MAX_MATCHES,
                  pids: tuple[int, ...] = ()) -> Resolution:
    """Resolve every SPEC, failing on the first bad one before anything is attached."""
    total = Resolution()
    for text in specs:
        one = resolve_spec(parse_spec(text), max_matches, pids)
        total.probes.extend(one.probes)
        total.warnings.extend(one.warnings)
        total.notes.extend(one.notes)
    return total
