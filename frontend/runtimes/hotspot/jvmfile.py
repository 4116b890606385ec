"""What libjvm.so tells of itself: where the VM's description tables and their entry layouts are linked (the
``gHotSpot*`` symbols, exported in ``.dynsym`` by every HotSpot since JDK 6: 24 of them in JDK 17 and 25),
and its load segments (a mapping's load bias). Read once per file (frontend/symbols/filefacts.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from optrace.fileaccess import BoundedFile
from optrace.frontend.runtimes.symbolnames import find_symbols
from optrace.frontend.runtimes.hotspot.vmstructs import SYMBOLS
from optrace.frontend.symbols.filefacts import FileFacts, FileKey
from optrace.frontend.symbols.elffile import ElfFile
from optrace.frontend.unwind.unwindfile import UnwindFile, file_without_rows
from optrace.procfs import MapEntry

LIBJVM = "libjvm.so"


@dataclass(frozen=True)
class JvmFile:
    """Link-time facts of one libjvm.so (addresses before the load bias)."""

    symbols: dict[str, int]  # every name of SYMBOLS -> its address
    segments: UnwindFile
    identity: FileKey

    def bias(self, entry: MapEntry) -> int:
        return self.segments.bias(entry)


def _read(elf: ElfFile, reader: BoundedFile, shown: str, identity: FileKey) -> JvmFile | str:
    found = find_symbols(elf, ".dynsym", SYMBOLS)
    missing = [name for name in SYMBOLS if name not in found]
    if missing:
        return f"{shown} exports no {missing[0]}"
    return JvmFile({name: address for name, (address, _size) in found.items()}, file_without_rows(reader), identity)


_files: FileFacts[JvmFile] = FileFacts(_read)


def libjvm_mapping(entries: list[MapEntry]) -> MapEntry | None:
    """The first executable mapping of a file named libjvm.so, if any."""
    return next((e for e in entries if e.is_file and e.executable and os.path.basename(e.file_path) == LIBJVM),
                None)


def jvm_file(pid: int, entry: MapEntry) -> JvmFile | str:
    return _files.facts(pid, entry)
