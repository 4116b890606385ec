"""Kernel text symbols from /proc/kallsyms (perf's kernel ``machine`` symbols, modules as ``[ext4]``).

The table stays for the whole life of a long-running exporter, so it is compact: sorted addresses in an
``array('Q')``, all names in one bytes blob cut by an offsets array, a module index per symbol
(about 5 MB for 120k symbols where a list of Python objects took about 55 MB). A name is decoded when
it is looked up.
"""
from __future__ import annotations

import bisect
import re
from array import array
from collections.abc import Iterable
from itertools import accumulate, compress, islice, repeat
from operator import eq, not_
from dataclasses import dataclass

from optrace.errors import OptraceError
from optrace.frontend.symbols.symbol import name_preference

KALLSYMS = "/proc/kallsyms"
# ADDRESS TYPE NAME [\t[MODULE]], for the text types tTwW only (perf's kallsyms__is_function)
TEXT_LINE = re.compile(rb"^([0-9a-fA-F]+) [tTwW] ([^\s]+)(?:\s+\[([^\]\s]+)\])?[ \t]*$", re.M)
LINES_SLICE = 1 << 20  # bytes of /proc/kallsyms matched at a time (5.4 MB here)


@dataclass(frozen=True)
class KernelSymbol:
    name: str
    module: str | None  # "ext4" for a module's symbol, None for the kernel image


class Kallsyms:
    """Sorted kernel text symbols. Addresses have no sizes: an address belongs to the nearest symbol
    below it, as in perf. Among aliases at one address the preferred name is kept (see
    :func:`~optrace.frontend.symbols.symbol.name_preference`)."""

    def __init__(self, symbols: Iterable[tuple[int, KernelSymbol]] = ()) -> None:
        self._addresses = array("Q")
        self._name_ends = array("I")  # name i is _names[_name_ends[i-1]:_name_ends[i]]
        self._module_ids = array("H")  # index in _modules; 0 is the kernel image (None)
        self._modules: list[str | None] = [None]
        self._names = b""
        self._pack((address, symbol.name.encode(), symbol.module) for address, symbol in symbols)

    @classmethod
    def load(cls, path: str = KALLSYMS) -> "Kallsyms":
        """Parse ``path``. Raises OptraceError when it cannot be read or its addresses are hidden."""
        try:
            with open(path, "rb") as handle:
                text = handle.read()
        except OSError as err:
            raise OptraceError(f"cannot read {path}: {err.strerror}") from None
        table = cls()
        table._pack_columns(*_text_columns(text))
        if len(table) and table._addresses[-1] == 0:  # sorted: the largest is 0 only if all are
            raise OptraceError("kernel symbols are hidden (kptr_restrict): run as root")
        return table

    def __len__(self) -> int:
        return len(self._addresses)

    def find(self, address: int) -> KernelSymbol | None:
        index = bisect.bisect_right(self._addresses, address) - 1
        if index < 0:
            return None
        start = self._name_ends[index - 1] if index else 0
        name = self._names[start:self._name_ends[index]].decode("utf-8", "replace")
        return KernelSymbol(name, self._modules[self._module_ids[index]])

    def _pack(self, rows: Iterable[tuple[int, bytes, str | None]]) -> None:
        addresses, names, modules = array("Q"), [], []
        for address, name, module in rows:
            addresses.append(address)
            names.append(name)
            modules.append(module)
        self._pack_columns(addresses, names, modules)

    def _pack_columns(self, addresses: array, names: list[bytes], modules: list[str | None]) -> None:
        """The symbols (in file order) sorted by address, one per address (see :func:`_preferred`), in C
        where it can be: 120k symbols are loaded at every start, beside the compile."""
        kept = _preferred(addresses, names)
        self._addresses = array("Q", map(addresses.__getitem__, kept))
        kept_names = list(map(names.__getitem__, kept))
        self._names = b"".join(kept_names)
        self._name_ends = array("I", accumulate(map(len, kept_names)))
        kept_modules = list(map(modules.__getitem__, kept))
        module_ids: dict[str | None, int] = {None: 0}
        for module in dict.fromkeys(kept_modules):
            module_ids.setdefault(module, len(module_ids))
        self._modules = list(module_ids)
        self._module_ids = array("H", map(module_ids.__getitem__, kept_modules))


def _preferred(addresses: array, names: list[bytes]) -> list[int]:
    """Indices of the symbols to keep, in address order: one per address, the preferred alias (the first
    in file order among equally preferred ones)."""
    order = sorted(range(len(addresses)), key=addresses.__getitem__)  # stable: aliases in file order
    ordered = list(map(addresses.__getitem__, order))
    same_as_next = list(map(eq, ordered, islice(ordered, 1, None))) + [False]
    kept = list(order)
    run_start = None
    for position in compress(range(len(order)), same_as_next):  # aliases: a few hundred of 120k
        if run_start is None:
            run_start = position
        if not same_as_next[position + 1]:  # position + 1 ends the run
            best = order[run_start]
            for alias in order[run_start + 1:position + 2]:
                if name_preference(names[alias]) > name_preference(names[best]):
                    best = alias
            kept[position + 1] = best
            run_start = None
    return list(compress(kept, map(not_, same_as_next)))


def _text_columns(text: bytes) -> tuple[array, list[bytes], list[str | None]]:
    """(addresses, names, modules) of the text symbol lines ``ADDRESS TYPE NAME [\\t[MODULE]]``, in file
    order; matched a slice of lines at a time (no list of every line's match at once)."""
    addresses, names, modules = array("Q"), [], []
    decoded: dict[bytes, str | None] = {b"": None}
    start = 0
    while start < len(text):
        end = text.find(b"\n", start + LINES_SLICE)
        end = len(text) if end < 0 else end + 1
        rows = TEXT_LINE.findall(text, start, end)
        start = end
        if not rows:
            continue
        hexes, chunk_names, chunk_modules = zip(*rows)
        addresses.extend(map(int, hexes, repeat(16)))
        names.extend(chunk_names)
        for module in set(chunk_modules).difference(decoded):
            decoded[module] = module.decode("utf-8", "replace")
        modules.extend(map(decoded.__getitem__, chunk_modules))
    return addresses, names, modules
