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
import functools
import os
import shutil
from dataclasses import dataclass, field

from optrace.fileaccess import BoundedFile, printable
from optrace.errors import OptraceError
from optrace.frontend.symbols.linker import find_library, read_ld_so_cache
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


def _preferred_name(names: list[Symbol], pattern: str) -> Symbol:
    """The name to show for an address: the preferred alias (the symbolizer's rule, so `count` and
    `report` name a function alike) among those the SPEC names, so `c:__libc_malloc` shows that name."""
    named = [symbol for symbol in names if fnmatch.fnmatchcase(symbol.name, pattern)]
    return preferred_alias(named or names)


def _matching(spec: ProbeSpec, elf: ElfFunctions, path: str) -> list[Symbol]:
    assert spec.symbol is not None
    if spec.is_glob:
        found = [f for f in elf.functions if fnmatch.fnmatchcase(f.name, spec.symbol)]
        if not found:
            raise OptraceError(printable(f"no function in {path} matches '{spec.symbol}'"))
    else:
        found = [f for f in elf.functions if f.name == spec.symbol]
        if not found:
            names = sorted({f.name for f in elf.functions})
            close = difflib.get_close_matches(spec.symbol, names, n=3, cutoff=0.6)
            hint = f": did you mean {', '.join(close)}?" if close else ""
            raise OptraceError(printable(f"no function '{spec.symbol}' in {path}{hint}"))
    return found


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
        main = _preferred_name(names, spec.symbol)
        label = f"{main.name} [ifunc resolver]" if main.is_ifunc else main.name
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


@functools.cache
def _ld_so_cache() -> dict[str, list[str]]:
    return read_ld_so_cache()


def find_object(name: str) -> str:
    """Path of the file a SPEC's object part names (not yet checked to be ELF), found the way the
    dynamic linker finds libraries: ``c`` is the libc of ld.so.cache, ``libm.so.6`` the cached libm; a
    name that is no cached library is a program on PATH (``bash:readline``); a name with ``/`` a path."""
    if "/" in name:
        if not os.path.exists(name):
            raise OptraceError(f"no such file: {printable(name)}")
        return name
    found = find_library(name, _ld_so_cache()) or shutil.which(name)
    if found:
        return found
    raise OptraceError(
        f"'{printable(name)}' is neither a library in the ld.so cache nor a program on PATH: give its full path"
    )


def name_list(names: list[str], shown: int = 5) -> str:
    """``a, b, c, d, e and 7 more``: names for a one-line message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def resolve_spec(spec: ProbeSpec, max_matches: int = DEFAULT_MAX_MATCHES) -> Resolution:
    path = os.path.realpath(find_object(spec.obj))
    with open_binary(path) as binary:
        elf = load_functions(binary)
        st = os.fstat(binary.fd)
        if spec.address is not None:
            return Resolution(probes=[_probe_at_address(spec, elf, binary, st)])
    found = _matching(spec, elf, path)
    probes = _probes_for_symbols(spec, elf, path, st, found, max_matches)
    ifuncs = [p.symbol.split(" ")[0] for p in probes if p.symbol.endswith("[ifunc resolver]")]
    warnings = []
    if ifuncs:
        warnings.append(printable(
            f"{name_list(ifuncs)} in {path} {'is an IFUNC' if len(ifuncs) == 1 else 'are IFUNCs'}: the probe counts "
            "calls of the resolver (usually once per process), not of the implementation it selects"
        ))
    return Resolution(probes=probes, warnings=warnings)


def resolve_specs(specs: list[str] | tuple[str, ...], max_matches: int = DEFAULT_MAX_MATCHES) -> Resolution:
    """Resolve every SPEC, failing on the first bad one before anything is attached."""
    total = Resolution()
    for text in specs:
        one = resolve_spec(parse_spec(text), max_matches)
        total.probes.extend(one.probes)
        total.warnings.extend(one.warnings)
    return total
