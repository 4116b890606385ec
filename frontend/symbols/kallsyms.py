"""Kernel text symbols from /proc/kallsyms (perf's kernel ``machine`` symbols, modules as ``[ext4]``).

The table stays for the whole life of a long-running exporter, so it is compact: sorted addresses in an
``array('Q')``, all names in one bytes blob cut by an offsets array, a module index per symbol
(about 5 MB for 120k symbols where a list of Python objects took about 55 MB). A name is decoded when
it is looked up.
"""
from __future__ import annotations

import bisect
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass
from itertools import accumulate

from optrace.errors import OptraceError
from optrace.frontend.symbols.symbol import name_preference

KALLSYMS = "/proc/kallsyms"


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
        rows = [(address, symbol.name.encode(), symbol.module) for address, symbol in symbols]
        modules = {index: row[2] for index, row in enumerate(rows) if row[2] is not None}
        self._pack(array("Q", [row[0] for row in rows]), [row[1] for row in rows], modules)

    @classmethod
    def load(cls, path: str = KALLSYMS) -> "Kallsyms":
        """Parse ``path``. Raises OptraceError when it cannot be read or its addresses are hidden."""
        try:
            with open(path, "rb") as handle:
                text = handle.read()
        except OSError as err:
            raise OptraceError(f"cannot read {path}: {err.strerror}") from None
        table = cls()
        try:
            table._pack(*_text_columns(text))
        except ValueError:
            raise OptraceError(f"cannot read {path}: an address is not hexadecimal") from None
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

    def _pack(self, addresses: array, names: list[bytes], modules: dict[int, str]) -> None:
        """Keep one symbol per address, sorted by address. The columns are in file order; ``modules``
        holds the module of each symbol that has one (by index), a few among 120k."""
        module_ids = array("H", bytes(2 * len(addresses)))
        numbers: dict[str, int] = {}
        for index, module in modules.items():
            if module not in numbers:
                numbers[module] = len(self._modules)
                self._modules.append(module)
            module_ids[index] = numbers[module]
        order, losers = _preferred_aliases(addresses, names)
        columns = (addresses, module_ids, names)
        if order is not None:
            columns = tuple(_reordered(column, order) for column in columns)
        self._addresses, self._module_ids, names = (_without(column, losers) for column in columns)
        self._names = b"".join(names)
        self._name_ends = array("I", accumulate(map(len, names)))


def _preferred_aliases(addresses: array, names: list[bytes]) -> tuple[list[int] | None, list[int]]:
    """The order that sorts ``addresses`` (None when they are sorted), and the positions in that order of
    the aliases that lose to another at their address: the preferred alias stays (the first in file order
    among equally preferred ones). /proc/kallsyms is in address order already, with a few hundred aliases
    among 120k symbols: only those are compared."""
    ordered = array("Q", sorted(addresses))
    order = None if ordered == addresses else sorted(range(len(addresses)), key=addresses.__getitem__)
    in_file = (lambda position: position) if order is None else order.__getitem__  # stable: aliases in file order
    losers = []
    for address in [address for address, count in Counter(addresses).items() if count > 1]:
        run = range(bisect.bisect_left(ordered, address), bisect.bisect_right(ordered, address))
        best = max(run, key=lambda position: (name_preference(names[in_file(position)]), -in_file(position)))
        losers += [position for position in run if position != best]
    return order, sorted(losers)


def _reordered(column: MutableSequence, order: list[int]) -> MutableSequence:
    reordered = column[:0]
    reordered.extend(map(column.__getitem__, order))
    return reordered


def _without(column: MutableSequence, cut: list[int]) -> MutableSequence:
    """``column`` without the items at the sorted positions ``cut``, joined from the slices between them."""
    if not cut:
        return column
    kept = column[:0]
    for start, end in zip([-1, *cut], [*cut, len(column)]):
        kept += column[start + 1:end]
    return kept


TEXT_TYPES = b"tTwW"  # perf's kallsyms__is_function


def _text_columns(text: bytes) -> tuple[array, list[bytes], dict[int, str]]:
    """Addresses, names and modules (by index, where there is one) of the text symbol lines
    ``ADDRESS TYPE NAME[\t[MODULE]]`` (the kernel writes a module after a tab), in file order. The
    address field has one width (the kernel's pointer size), so the lines are cut by position and the
    addresses decoded as one hex string: with a regular expression and int() per line, the whole load
    took 0.125 s of CPU here, 0.086 s so (0.035 s of either is the kernel writing the text). Raises
    ValueError on an address that is not hexadecimal."""
    width = max(text.find(b" "), 1)
    kinds = {b" %c " % kind for kind in TEXT_TYPES}
    lines = [line for line in text.split(b"\n") if line[width:width + 3] in kinds and len(line) > width + 3]
    addresses = _hex_addresses([line[:width] for line in lines], width)
    names = [line[width + 3:] for line in lines]
    modules: dict[int, str] = {}
    decoded: dict[bytes, str] = {}
    spaced = [i for i, name in enumerate(names) if b"\t" in name] if b"\t" in text else []
    for index in spaced:
        name, *rest = names[index].split(None, 1)
        names[index] = name
        module = rest[0].strip() if rest else b""
        if module.startswith(b"[") and module.endswith(b"]") and len(module) > 2:
            modules[index] = decoded.setdefault(module, module[1:-1].decode("utf-8", "replace"))
    return addresses, names, modules


def _hex_addresses(fields: list[bytes], width: int) -> array:
    if width == 16:  # 64-bit: bytes.fromhex reads them all at once, big-endian
        addresses = array("Q", bytes.fromhex(b"".join(fields).decode("ascii")))
        if sys.byteorder == "little":
            addresses.byteswap()
        return addresses
    return array("Q", [int(field, 16) for field in fields])
