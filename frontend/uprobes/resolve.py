"""Resolve a :class:`ProbeSpec` to uprobe targets: (device, inode, file offset) plus printable names.

Symbols come from ``.symtab`` and ``.dynsym`` (pyelftools). A symbol's value is an ELF virtual address;
the kernel wants a file offset, which the PT_LOAD program header holding the address gives for PIE and
non-PIE objects alike. Symbols sharing one address (``malloc`` / ``__libc_malloc``) are one probe.
"""
from __future__ import annotations

import difflib
import fnmatch
import functools
import os
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerSymSection

from optrace.frontend.errors import OptraceError
from optrace.frontend.uprobes.library import find_object
from optrace.frontend.uprobes.spec import ProbeSpec, parse_spec

DEFAULT_MAX_MATCHES = 1000
_FUNCTION_TYPES = {"STT_FUNC": False, "STT_LOOS": True, "STT_GNU_IFUNC": True}  # type -> is IFUNC
_VERSYM_HIDDEN = 0x8000
_PF_X = 0x1


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


@dataclass(frozen=True)
class FunctionSymbol:
    name: str
    vaddr: int
    size: int
    is_ifunc: bool
    is_global: bool


@dataclass(frozen=True)
class ElfFunctions:
    """The function symbols of one object and the segments that map its file into memory."""

    functions: tuple[FunctionSymbol, ...]
    segments: tuple[tuple[int, int, int, bool], ...]  # (vaddr, filesz, file offset, executable)

    def file_offset(self, vaddr: int) -> int | None:
        for start, size, offset, executable in self.segments:
            if executable and start <= vaddr < start + size:
                return vaddr - start + offset
        return None


@dataclass
class Resolution:
    probes: list[ResolvedProbe] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _hidden_versions(elf: ELFFile) -> set[int]:
    """Indices of .dynsym entries that are non-default symbol versions (``name@VER``, not ``@@``)."""
    versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    if versym is None:
        return set()
    hidden = set()
    for index in range(versym.num_symbols()):
        ndx = versym.get_symbol(index).entry["ndx"]  # an int, or a name for the reserved values
        if isinstance(ndx, int) and ndx & _VERSYM_HIDDEN:
            hidden.add(index)
    return hidden


def _read_functions(elf: ELFFile) -> tuple[FunctionSymbol, ...]:
    seen: set[tuple[str, int]] = set()
    functions = []
    for section_name in (".symtab", ".dynsym"):
        section = elf.get_section_by_name(section_name)
        if section is None:
            continue
        hidden = _hidden_versions(elf) if section_name == ".dynsym" else set()
        for index, sym in enumerate(section.iter_symbols()):
            kind = sym["st_info"]["type"]
            if kind not in _FUNCTION_TYPES or sym["st_shndx"] == "SHN_UNDEF" or not sym["st_value"]:
                continue
            if index in hidden or not sym.name or (sym.name, sym["st_value"]) in seen:
                continue
            seen.add((sym.name, sym["st_value"]))
            functions.append(FunctionSymbol(
                name=sym.name, vaddr=sym["st_value"], size=sym["st_size"],
                is_ifunc=_FUNCTION_TYPES[kind], is_global=sym["st_info"]["bind"] != "STB_LOCAL",
            ))
    return tuple(functions)


@functools.lru_cache(maxsize=64)
def _load_cached(path: str, dev: int, ino: int, mtime_ns: int) -> ElfFunctions:
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            segments = tuple(
                (seg["p_vaddr"], seg["p_filesz"], seg["p_offset"], bool(seg["p_flags"] & _PF_X))
                for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"
            )
            return ElfFunctions(functions=_read_functions(elf), segments=segments)
    except ELFError as exc:
        raise OptraceError(f"{path} is not a valid ELF file: {exc}") from exc


def load_functions(path: str) -> ElfFunctions:
    """Function symbols of an ELF file, cached per (device, inode, mtime)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        st = os.stat(path)
    except OSError as exc:
        raise OptraceError(f"cannot read {path}: {exc.strerror}") from exc
    if magic != b"\x7fELF":
        raise OptraceError(f"{path} is not an ELF executable or library")
    return _load_cached(path, st.st_dev, st.st_ino, st.st_mtime_ns)


def _preferred_name(names: list[FunctionSymbol], pattern: str | None) -> FunctionSymbol:
    """The name to show for an address: one the SPEC matches, else global, fewest leading _, shortest."""
    def rank(symbol: FunctionSymbol) -> tuple:
        unmatched = pattern is None or not fnmatch.fnmatchcase(symbol.name, pattern)
        underscores = len(symbol.name) - len(symbol.name.lstrip("_"))
        return unmatched, not symbol.is_global, underscores, len(symbol.name), symbol.name

    return min(names, key=rank)


def _matching(spec: ProbeSpec, elf: ElfFunctions, path: str) -> list[FunctionSymbol]:
    assert spec.symbol is not None
    if spec.is_glob:
        found = [f for f in elf.functions if fnmatch.fnmatchcase(f.name, spec.symbol)]
        if not found:
            raise OptraceError(f"no function in {path} matches '{spec.symbol}'")
    else:
        found = [f for f in elf.functions if f.name == spec.symbol]
        if not found:
            names = sorted({f.name for f in elf.functions})
            close = difflib.get_close_matches(spec.symbol, names, n=3, cutoff=0.6)
            hint = f": did you mean {', '.join(close)}?" if close else ""
            raise OptraceError(f"no function '{spec.symbol}' in {path}{hint}")
    return found


def _probes_for_symbols(
    spec: ProbeSpec, elf: ElfFunctions, path: str, st: os.stat_result, found: list[FunctionSymbol],
    max_matches: int,
) -> list[ResolvedProbe]:
    at_address: dict[int, list[FunctionSymbol]] = {}
    for function in elf.functions:  # aliases at a matched address count as that probe, matched or not
        at_address.setdefault(function.vaddr, []).append(function)
    addresses = sorted({f.vaddr for f in found})
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
        raise OptraceError(f"'{spec.text}' names no code in an executable segment of {path}")
    return probes


def _probe_at_address(spec: ProbeSpec, elf: ElfFunctions, path: str, st: os.stat_result) -> ResolvedProbe:
    assert spec.address is not None
    offset = elf.file_offset(spec.address)
    if offset is None:
        raise OptraceError(f"address {spec.address:#x} is not in an executable segment of {path}")
    inside = [f for f in elf.functions if f.vaddr <= spec.address < f.vaddr + max(f.size, 1)]
    if inside:
        function = _preferred_name(inside, None)
        delta = spec.address - function.vaddr
        label = f"{function.name}+{delta:#x}" if delta else function.name
    else:
        label = f"{spec.address:#x}"
    return ResolvedProbe(spec=spec.text, binary=path, symbol=label, offset=offset,
                         key=ProbeKey(st.st_dev, st.st_ino, offset))


def name_list(names: list[str], shown: int = 5) -> str:
    """``a, b, c, d, e and 7 more``: names for a one-line message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def resolve_spec(spec: ProbeSpec, max_matches: int = DEFAULT_MAX_MATCHES) -> Resolution:
    path = os.path.realpath(find_object(spec.obj))
    elf = load_functions(path)
    st = os.stat(path)
    if spec.address is not None:
        return Resolution(probes=[_probe_at_address(spec, elf, path, st)])
    found = _matching(spec, elf, path)
    probes = _probes_for_symbols(spec, elf, path, st, found, max_matches)
    ifuncs = [p.symbol.split(" ")[0] for p in probes if p.symbol.endswith("[ifunc resolver]")]
    warnings = []
    if ifuncs:
        warnings.append(
            f"{name_list(ifuncs)} in {path} {'is an IFUNC' if len(ifuncs) == 1 else 'are IFUNCs'}: the probe counts "
            "calls of the resolver (usually once per process), not of the implementation it selects"
        )
    return Resolution(probes=probes, warnings=warnings)


def resolve_specs(specs: list[str] | tuple[str, ...], max_matches: int = DEFAULT_MAX_MATCHES) -> Resolution:
    """Resolve every SPEC, failing on the first bad one before anything is attached."""
    total = Resolution()
    for text in specs:
        one = resolve_spec(parse_spec(text), max_matches)
        total.probes.extend(one.probes)
        total.warnings.extend(one.warnings)
    return total
