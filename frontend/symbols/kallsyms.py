"""Kernel text symbols from /proc/kallsyms (perf's kernel ``machine`` symbols, modules as ``[ext4]``).

The table stays for the whole life of a long-running exporter, so it is compact: sorted addresses in an
``array('Q')``, all names in one bytes blob cut by an offsets array, a module index per symbol
(about 5 MB for 120k symbols where a list of Python objects took about 55 MB). A name is decoded when
it is looked up.

Parsing the text is most of a load (0.08 of 0.12 s of CPU here, in every run; the kernel writing the
text is the rest). The kernel writes its image's symbols, then its modules', then those that come and go
(JITed BPF programs, ftrace trampolines, kprobe slots: DYNAMIC_MODULES), optrace's own programs among
them. That tail is parsed in every load. The table of the rest is kept in the cache directory
``kallsyms`` (optrace/cachedir.py) under a SHA-256 of that text itself and of this parser's source: a
run that reads the same text (same boot, same modules) reads the table back (5 ms) instead; any other
text is parsed and kept (at most MAX_STORED_BYTES of tables, the least recently used out first).
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass
from itertools import accumulate

from optrace import __version__
from optrace.cachedir import CacheDirectory, default_directory
from optrace.errors import MalformedInput, OptraceError
from optrace.frontend.symbols import symbol as symbol_module
from optrace.frontend.symbols.symbol import name_preference

KALLSYMS = "/proc/kallsyms"
STORE_MAGIC = b"optrace kernel symbols 1\n"
MAX_TABLE_BYTES = 64 << 20
MAX_STORED_BYTES = 32 << 20  # a few kernels' tables: 4.7 MB for 120k symbols here
DYNAMIC_MODULES = (b"\t[bpf]", b"\t[__builtin__ftrace]", b"\t[__builtin__kprobes]")


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
        self._dynamic: Kallsyms | None = None  # the symbols of the text's tail that comes and goes
        rows = [(address, symbol.name.encode(), symbol.module) for address, symbol in symbols]
        modules = {index: row[2] for index, row in enumerate(rows) if row[2] is not None}
        self._pack(array("Q", [row[0] for row in rows]), [row[1] for row in rows], modules)

    @classmethod
    def load(cls, path: str = KALLSYMS, stored: CacheDirectory | None = None) -> "Kallsyms":
        """Parse ``path``, or read the table of the same text back from ``stored``. Raises OptraceError
        when it cannot be read or its addresses are hidden."""
        try:
            with open(path, "rb") as handle:
                text = handle.read()
        except OSError as err:
            raise OptraceError(f"cannot read {path}: {err.strerror}") from None
        fixed, dynamic = _dynamic_tail(text)
        key = _stored_key(fixed) if stored is not None and stored.usable else None
        table = cls._stored(stored, key) if key else None
        if table is None:
            table = cls._parsed(fixed, path)
            if key:
                stored.write(key, *table._encoded())
        table._dynamic = cls._parsed(dynamic, path) if dynamic else None
        return table

    @classmethod
    def _parsed(cls, text: bytes, path: str) -> "Kallsyms":
        table = cls()
        try:
            table._pack(*_text_columns(text))
        except ValueError:
            raise OptraceError(f"cannot read {path}: an address is not hexadecimal") from None
        if len(table) and table._addresses[-1] == 0:  # sorted: the largest is 0 only if all are
            raise OptraceError("kernel symbols are hidden (kptr_restrict): run as root")
        return table

    @classmethod
    def _stored(cls, stored: CacheDirectory, key: str) -> "Kallsyms | None":
        entry = stored.read(key)
        if entry is None:
            return None
        try:
            table = cls._decoded(*entry)
        except (KeyError, TypeError, ValueError):
            stored.rejected()
            return None
        stored.accepted(key)
        return table

    def _encoded(self) -> tuple[dict, bytes]:
        header = {"count": len(self._addresses), "names": len(self._names), "modules": self._modules[1:],
                  "byteorder": sys.byteorder}
        columns = (self._addresses, self._name_ends, self._module_ids)
        return header, b"".join(column.tobytes() for column in columns) + self._names

    @classmethod
    def _decoded(cls, header: dict, payload: bytes) -> "Kallsyms":
        """The table :meth:`_encoded` wrote; ValueError (or KeyError, TypeError) when it is not one."""
        count, names, modules = header["count"], header["names"], header["modules"]
        if (header["byteorder"] != sys.byteorder or not all(isinstance(name, str) for name in modules)
                or not isinstance(count, int) or not isinstance(names, int) or min(count, names) < 0):
            raise MalformedInput("not this machine's table")
        table = cls()
        columns = (array("Q"), array("I"), array("H"))
        view, start = memoryview(payload), 0
        for column in columns:
            end = start + count * column.itemsize
            column.frombytes(view[start:end])
            start = end
        if len(payload) != start + names or (count and (columns[1][-1] != names or max(columns[2]) > len(modules))):
            raise MalformedInput("the columns do not match")
        table._addresses, table._name_ends, table._module_ids = columns
        table._names = payload[start:]
        table._modules = [None, *modules]
        return table

    def __len__(self) -> int:
        return len(self._addresses) + (len(self._dynamic) if self._dynamic is not None else 0)

    def find(self, address: int) -> KernelSymbol | None:
        index = bisect.bisect_right(self._addresses, address) - 1
        dynamic = self._dynamic
        if dynamic is not None:
            other = bisect.bisect_right(dynamic._addresses, address) - 1
            if other >= 0 and (index < 0 or dynamic._addresses[other] > self._addresses[index]
                               or (dynamic._addresses[other] == self._addresses[index]
                                   and name_preference(dynamic._name(other)) > name_preference(self._name(index)))):
                return dynamic._symbol(other)
        return self._symbol(index) if index >= 0 else None

    def _name(self, index: int) -> bytes:
        return self._names[self._name_ends[index - 1] if index else 0:self._name_ends[index]]

    def _symbol(self, index: int) -> KernelSymbol:
        return KernelSymbol(self._name(index).decode("utf-8", "replace"), self._modules[self._module_ids[index]])

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


def stored_symbols() -> CacheDirectory:
    """This user's directory of parsed tables."""
    return CacheDirectory(default_directory("kallsyms"), STORE_MAGIC, MAX_TABLE_BYTES, MAX_STORED_BYTES)


@functools.cache
def _parser_fingerprint() -> bytes:
    """optrace's version and the source of what decides a table: this parser and the alias preference."""
    digest = hashlib.sha256(__version__.encode())
    for module in (sys.modules[__name__], symbol_module):
        with open(module.__file__, "rb") as source:
            digest.update(source.read())
    return digest.digest()


def _dynamic_tail(text: bytes) -> tuple[bytes, bytes]:
    """``text`` cut at the start of the first line of a module that comes and goes."""
    first = min((at for at in map(text.find, DYNAMIC_MODULES) if at >= 0), default=-1)
    if first < 0:
        return text, b""
    start = text.rfind(b"\n", 0, first) + 1
    return text[:start], text[start:]


def _stored_key(text: bytes) -> str:
    digest = hashlib.sha256(_parser_fingerprint())
    digest.update(text)
    return digest.hexdigest()[:40]


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
