"""`optrace jit show FILE` and `optrace jit convert DUMP [-o OUT]`: inspect and convert JIT symbol files.

Both read the file under :mod:`optrace.fileaccess`'s rule (regular, bounded, never blocking), print every
name and path through :func:`~optrace.fileaccess.printable` (a name is whatever the JIT wrote: terminal
escapes included), and `convert` writes its ELF file atomically without following a planted symlink.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import TypeVar

import click

from optrace.errors import OptraceError
from optrace.exporters.formats import JIT_LISTING
from optrace.fileaccess import printable
from optrace.frontend.report.jitlisting import JitDumpListing, Listing, PerfMapListing, skipped_note
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.agent import host_elf_machine
from optrace.jitmaps.elfwriter import ElfLimitError, code_regions, live_regions, write_elf
from optrace.jitmaps.lifetimes import JitFunction, from_perf_map, jitdump_clock, jitdump_timeline
from optrace.jitmaps.perfmap import PerfMapEntry, PerfMapReader
from optrace.jitmaps.trust import DEFAULT_MAX_SIZE, RefusedFile, named_file_policy, open_file
from optrace.procfs import read_maps

MAX_ELF_MACHINE = 0xFFFF  # e_machine is 16 bits; a jitdump's elf_mach field is 32
MAX_ITEMS = 500_000  # perf-map entries or jitdump records kept for show/convert (~0.35 GB); the rest are counted
PID_IN_NAME = re.compile(r"([0-9]{1,10})(?!.*[0-9])")
T = TypeVar("T")


@contextmanager
def _open_named(path: str, max_size: int) -> Iterator[int]:
    """A file the user named: any owner, links followed, but regular and under the size limit."""
    try:
        fd = open_file(path, named_file_policy(max_size))
    except RefusedFile as refused:
        raise OptraceError(f"cannot read {refused}") from None
    if fd is None:
        raise OptraceError(f"{printable(path)}: no such file")
    try:
        yield fd
    finally:
        os.close(fd)


def _is_jitdump(fd: int) -> bool:
    magic = os.pread(fd, 4, 0)
    return len(magic) == 4 and int.from_bytes(magic, "little") in (jd.MAGIC, jd.MAGIC_SWAPPED)


def _take(items: Iterator[T], limit: int = MAX_ITEMS) -> tuple[list[T], int]:
    """The first ``limit`` items, and how many more there were (read, counted, not kept)."""
    kept = list(islice(items, limit))
    return kept, sum(1 for _ in items)


def _read_dump(fd: int, path: str, max_size: int) -> tuple[jd.JitDumpHeader, list[jd.JitRecord], jd.JitDumpReader, int]:
    reader = jd.JitDumpReader()
    try:
        records, skipped = _take(reader.read_new(fd, final=True, max_size=max_size))
        if reader.header is None:
            raise jd.JitDumpError("empty file (not a jitdump)")
    except jd.JitDumpError as exc:
        raise OptraceError(f"{printable(path)}: not a usable jitdump: {exc}") from None
    return reader.header, records, reader, skipped


def _read_map(fd: int, max_size: int) -> tuple[list[PerfMapEntry], PerfMapReader, int]:
    reader = PerfMapReader()
    entries, skipped = _take(reader.read_new(fd, final=True, max_size=max_size))
    return entries, reader, skipped


@click.group("jit")
def command() -> None:
    """Inspect and convert JIT symbol files (perf maps, jitdumps)."""


@command.command("show")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--max-size", type=int, default=DEFAULT_MAX_SIZE, show_default=True, help="Refuse larger files.")
def show(file: str, max_size: int) -> None:
    """List a perf map or jitdump: address, size, name, load time, moves and replacements."""
    with _open_named(file, max_size) as fd:
        if _is_jitdump(fd):
            header, records, reader, skipped = _read_dump(fd, file, max_size)
            listing: Listing = JitDumpListing(file, header, records, reader, skipped)
        else:
            listing = PerfMapListing(file, *_read_map(fd, max_size))
    stdout = click.get_text_stream("stdout")
    JIT_LISTING.writer("listing")(stdout, listing, None)
    stdout.flush()


@command.command("convert")
@click.argument("dump", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="ELF file to write [default: jit-PID.elf].")
@click.option("--max-size", type=int, default=DEFAULT_MAX_SIZE, show_default=True, help="Refuse larger inputs.")
def convert(dump: str, output: str | None, max_size: int) -> None:
    """Write an ELF file (sections per JIT region, symbols, code, build-id) from a jitdump or perf map."""
    with _open_named(dump, max_size) as fd:
        if _is_jitdump(fd):
            header, records, _, skipped = _read_dump(fd, dump, max_size)
            kept = len(records)
            functions, pid = jitdump_timeline(header, records)[0], header.pid
            mach, order, known = header.elf_mach, header.byte_order, _live_regions(pid, dump, functions)
            time_unit = jitdump_clock(header, records).unit
        else:
            entries, _, skipped = _read_map(fd, max_size)
            kept = len(entries)
            functions, pid = from_perf_map(entries), _pid_from_name(dump)
            mach, order, known, time_unit = host_elf_machine(), "<", [], "line"
    if not functions:
        raise OptraceError(f"{printable(dump)}: no JIT functions in it, nothing to convert")
    if not 0 <= mach <= MAX_ELF_MACHINE:
        raise OptraceError(f"{printable(dump)}: its header's machine {mach} is not an ELF machine number")
    out = output or f"jit-{pid}.elf"
    try:
        summary = write_elf(out, functions, mach, code_regions(functions, known), order, time_unit)
    except ElfLimitError as exc:
        raise OptraceError(f"{printable(dump)}: {exc}") from None
    except OSError as exc:
        raise OptraceError(f"cannot write {printable(out)}: {exc.strerror or exc}") from None
    click.echo(f"wrote {printable(summary.path)}: {len(summary.sections)} code sections, {summary.symbols} "
               f"symbols, build-id {summary.build_id}{skipped_note(kept, skipped, 'entries or records')}")


def _live_regions(pid: int, dump: str, functions: list[JitFunction]) -> list[tuple[int, int]]:
    """The live process's anonymous executable mappings when it still runs with this dump mapped."""
    maps = read_maps(pid)
    text = maps.text if maps is not None else ""
    return live_regions(text, functions) if os.path.basename(dump) in text else []


def _pid_from_name(path: str) -> int:
    """perf-PID.map -> PID (0 when the name holds no pid)."""
    found = PID_IN_NAME.search(os.path.basename(path))
    return int(found.group(1)) if found else 0
