"""What libjvm.so tells of itself: where the VM's description tables and their entry layouts are linked (the
``gHotSpot*`` symbols, exported in ``.dynsym`` by every HotSpot since JDK 6: 24 of them in JDK 17 and 25),
and its load segments (a mapping's load bias). Read once per file (frontend/runtimes/runtimefile.py)."""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from optrace.fileaccess import BoundedFile, printable
from optrace.frontend.python.symbolnames import find_symbols
from optrace.frontend.runtimes.hotspot.vmstructs import SYMBOLS
from optrace.frontend.runtimes.runtimefile import FileKey, RuntimeFiles
from optrace.frontend.symbols.elffile import EM_X86_64, ElfFile
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


def _read(reader: BoundedFile, shown: str, identity: FileKey) -> JvmFile | str:
    try:
        elf = ElfFile(reader)
        if elf.elfclass != 64 or not elf.little_endian or elf.machine != EM_X86_64:
            return f"{shown} is not an x86_64 ELF file"
        found = find_symbols(elf, ".dynsym", SYMBOLS)
        missing = [name for name in SYMBOLS if name not in found]
        if missing:
            return f"{shown} exports no {missing[0]}"
        return JvmFile({name: address for name, (address, _size) in found.items()}, file_without_rows(reader), identity)
    except (OSError, ValueError, struct.error) as err:  # ElfFormatError and BudgetExceeded included
        return f"cannot read {shown}: {printable(err)[:200]}"


_files: RuntimeFiles[JvmFile] = RuntimeFiles(_read)


def libjvm_mapping(entries: list[MapEntry]) -> MapEntry | None:
    """The first executable mapping of a file named libjvm.so, if any."""
    return next((e for e in entries if e.is_file and e.executable and os.path.basename(e.file_path) == LIBJVM),
                None)


def jvm_file(pid: int, entry: MapEntry) -> JvmFile | str:
    return _files.facts(pid, entry)
