"""Kernel text symbols from /proc/kallsyms (perf's kernel ``machine`` symbols, modules as ``[ext4]``)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from optrace.frontend.errors import OptraceError

KALLSYMS = "/proc/kallsyms"
TEXT_TYPES = frozenset("tTwW")  # perf's kallsyms__is_function


@dataclass(frozen=True)
class KernelSymbol:
    name: str
    module: str | None  # "ext4" for a module's symbol, None for the kernel image


class Kallsyms:
    """Sorted kernel text symbols. Addresses have no sizes: an address belongs to the nearest symbol
    below it, as in perf."""

    def __init__(self, symbols: list[tuple[int, KernelSymbol]]) -> None:
        best: dict[int, KernelSymbol] = {}
        for address, symbol in symbols:
            kept = best.get(address)
            if kept is None or _preference(symbol) > _preference(kept):
                best[address] = symbol
        self._addresses = sorted(best)
        self._symbols = [best[address] for address in self._addresses]

    @classmethod
    def load(cls, path: str = KALLSYMS) -> "Kallsyms":
        """Parse ``path``. Raises OptraceError when it cannot be read or its addresses are hidden."""
        try:
            with open(path) as handle:
                text = handle.read()
        except OSError as err:
            raise OptraceError(f"cannot read {path}: {err.strerror}") from None
        symbols = parse_kallsyms(text)
        if symbols and all(address == 0 for address, _ in symbols):
            raise OptraceError("kernel symbols are hidden (kptr_restrict): run as root")
        return cls(symbols)

    def __len__(self) -> int:
        return len(self._addresses)

    def find(self, address: int) -> KernelSymbol | None:
        index = bisect.bisect_right(self._addresses, address) - 1
        return self._symbols[index] if index >= 0 else None


def parse_kallsyms(text: str) -> list[tuple[int, KernelSymbol]]:
    """Text symbols of /proc/kallsyms lines ``ADDRESS TYPE NAME [\\t[MODULE]]``."""
    symbols = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[1] not in TEXT_TYPES:
            continue
        module = fields[3].strip("[]") if len(fields) > 3 else None
        symbols.append((int(fields[0], 16), KernelSymbol(fields[2], module)))
    return symbols


def _preference(symbol: KernelSymbol) -> tuple:
    """Among aliases prefer names without leading underscores, then the longest."""
    return (-(len(symbol.name) - len(symbol.name.lstrip("_"))), len(symbol.name))
