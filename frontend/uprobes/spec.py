"""Parsing of probe SPECs as users write them: ``/path:symbol``, ``LIB:symbol``, ``LIB:glob*``, ``PATH:0xADDR``."""
from __future__ import annotations

import re
from dataclasses import dataclass

from optrace.errors import OptraceError

_GLOB_CHARS = re.compile(r"[*?\[]")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class ProbeSpec:
    """One SPEC split into its object and its target (a symbol, a glob or an ELF virtual address)."""

    text: str  # the SPEC exactly as given
    obj: str  # a path (contains "/") or a library / program name ("c", "libc.so.6", "bash")
    symbol: str | None = None  # exact name or fnmatch glob
    address: int | None = None  # ELF virtual address, as nm/objdump print it

    @property
    def is_glob(self) -> bool:
        return self.symbol is not None and bool(_GLOB_CHARS.search(self.symbol))


def parse_spec(text: str) -> ProbeSpec:
    """Split at the first ``:`` so C++-style ``::`` stays in the symbol part."""
    obj, sep, target = text.partition(":")
    if not sep or not obj or not target:
        raise OptraceError(
            f"bad probe '{text}': expected BINARY:SYMBOL, LIB:SYMBOL or BINARY:0xADDRESS (e.g. c:malloc)"
        )
    if _ADDRESS.fullmatch(target):
        return ProbeSpec(text=text, obj=obj, address=int(target, 16))
    return ProbeSpec(text=text, obj=obj, symbol=target)
