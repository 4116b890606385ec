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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from optrace.errors import OptraceError
from optrace.frontend.symbols.symbol import name_preference

KALLSYMS = "/proc/kallsyms"
# ADDRESS TYPE NAME [\t[MODULE]], for the text types tTwW only (perf's kallsyms__is_function)
TEXT_LINE = re.compile(rb"^([0-9a-fA-F]+) [tTwW] ([^\s]+)(?:\s+\[([^\]\s]+)\])?[ \t]*$", re.M)


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
        table._pack(_text_rows(text))
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
        module_ids: dict[str | None, int] = {None: 0}
        blob = bytearray()
        for address, name, module in _preferred_aliases(rows):
            if module not in module_ids:
                module_ids[module] = len(self._modules)
                self._modules.append(module)
            blob += name
            self._addresses.append(address)
            self._name_ends.append(len(blob))
            self._module_ids.append(module_ids[module])
        self._names = bytes(blob)


def _preferred_aliases(rows: Iterable[tuple[int, bytes, str | None]]) -> Iterator[tuple[int, bytes, str | None]]:
    """``rows`` in address order, one per address: the preferred alias (the first in file order among
    equally preferred ones)."""
    addresses = array("Q")
    names: list[bytes] = []
    modules: list[str | None] = []
    for address, name, module in rows:
        addresses.append(address)
        names.append(name)
        modules.append(module)
    order = sorted(range(len(addresses)), key=addresses.__getitem__)  # stable: aliases in file order
    run_start = 0
    for position, index in enumerate(order):
        if position + 1 < len(order) and addresses[order[position + 1]] == addresses[index]:
            continue  # the last of a run of aliases yields the run's winner
        best = order[run_start]
        for alias in order[run_start + 1:position + 1]:
            if name_preference(names[alias]) > name_preference(names[best]):
                best = alias
        run_start = position + 1
        yield addresses[best], names[best], modules[best]


def _text_rows(text: bytes) -> Iterable[tuple[int, bytes, str | None]]:
    """(address, name, module) of each text symbol line ``ADDRESS TYPE NAME [\\t[MODULE]]``."""
    modules: dict[bytes, str] = {}
    for match in TEXT_LINE.finditer(text):  # not findall: no list of every line at once
        address, name, module = match.groups()
        if module and module not in modules:
            modules[module] = module.decode("utf-8", "replace")
        yield int(address, 16), name, modules[module] if module else None

