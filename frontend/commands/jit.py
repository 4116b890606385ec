"""`optrace jit show FILE` and `optrace jit convert DUMP [-o OUT]`: inspect and convert JIT symbol files."""
from __future__ import annotations

import os
from contextlib import contextmanager
from collections.abc import Iterator

import click

from optrace.frontend.errors import OptraceError
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.agent import host_elf_machine
from optrace.jitmaps.elfwriter import live_regions, page_regions, write_elf
from optrace.jitmaps.lifetimes import JitFunction, from_jitdump, from_perf_map
from optrace.jitmaps.perfmap import read_perf_map
from optrace.jitmaps.trust import DEFAULT_MAX_SIZE, RefusedFile, TrustPolicy, open_trusted

ELF_MACHINES = {3: "x86", 62: "x86-64", 40: "arm", 183: "aarch64", 243: "riscv", 21: "ppc64"}


@contextmanager
def _open_named(path: str, max_size: int) -> Iterator[int]:
    """A file the user named: any owner, links followed, but regular and under the size limit."""
    try:
        fd = open_trusted(path, TrustPolicy(None, max_size, follow_symlinks=True))
    except RefusedFile as refused:
        raise OptraceError(f"cannot read {refused}") from None
    if fd is None:
        raise OptraceError(f"{path}: no such file")
    try:
        yield fd
    finally:
        os.close(fd)


def _is_jitdump(fd: int) -> bool:
    magic = os.pread(fd, 4, 0)
    return len(magic) == 4 and int.from_bytes(magic, "little") in (jd.MAGIC, jd.MAGIC_SWAPPED)


def _read_dump(fd: int, path: str) -> tuple[jd.JitDumpHeader, list[jd.JitRecord], jd.JitDumpReader]:
    try:
        return jd.read_jitdump(fd)
    except jd.JitDumpError as exc:
        raise OptraceError(f"{path}: not a usable jitdump: {exc}") from None


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
            _show_jitdump(file, *_read_dump(fd, file))
        else:
            entries, reader = read_perf_map(fd)
            click.echo(f"perf map {file}: {len(entries)} entries, {reader.bad_lines} bad lines skipped")
            click.echo(f"{'LINE':>7}  {'ADDRESS':<18}  {'SIZE':>8}  NAME")
            for line, function in enumerate(from_perf_map(entries), 1):
                replaced = "" if function.died is None else f"  (replaced at entry {function.died:.0f})"
                click.echo(f"{line:>7}  0x{function.start:016x}  {function.size:>#8x}  {function.name}{replaced}")


def _show_jitdump(path: str, header: jd.JitDumpHeader, records: list[jd.JitRecord],
                  reader: jd.JitDumpReader) -> None:
    clock = "TSC" if header.flags & jd.FLAG_ARCH_TIMESTAMP else "CLOCK_MONOTONIC"
    order = "little" if header.byte_order == "<" else "big"
    click.echo(f"jitdump {path}: pid {header.pid}, version {header.version}, "
               f"{ELF_MACHINES.get(header.elf_mach, 'elf_mach ' + str(header.elf_mach))}, {order}-endian, "
               f"{clock} clock, {reader.records} records ({reader.unknown_records} unknown skipped, "
               f"{reader.truncated_bytes} truncated bytes at the end)")
    click.echo(f"{'TIME(s)':>12}  {'EVENT':<6}  {'ADDRESS':<18}  {'SIZE':>8}  NAME")
    functions = iter(from_jitdump(header, records))
    for record in records:
        when = (record.timestamp - header.timestamp) / 1e9
        click.echo(f"{when:>12.6f}  " + _describe(record, functions))


def _describe(record: jd.JitRecord, functions: Iterator[JitFunction]) -> str:
    if isinstance(record, jd.CodeLoad):
        function = next(functions)
        extra = " [code]" if record.code and any(record.code) else ""
        return f"load    0x{record.code_addr:016x}  {record.code_size:>#8x}  {record.name}{extra}{_fate(function)}"
    if isinstance(record, jd.CodeMove):
        function = next(functions, None)
        return (f"move    0x{record.new_code_addr:016x}  {record.code_size:>#8x}  "
                f"from 0x{record.old_code_addr:x} (code #{record.code_index}){_fate(function)}")
    if isinstance(record, jd.DebugInfo):
        files = sorted({e.filename for e in record.entries})
        lines = [e.lineno for e in record.entries]
        where = f"{', '.join(files)}:{min(lines)}-{max(lines)}" if lines else "no lines"
        return f"debug   0x{record.code_addr:016x}  {len(record.entries):>8}  lines in {where}"
    if isinstance(record, jd.UnwindingInfo):
        return f"unwind  {'':<18}  {record.unwinding_size:>#8x}  eh_frame_hdr {record.eh_frame_hdr_size:#x}"
    return "close"


def _fate(function: JitFunction | None) -> str:
    if function is None or function.died is None:
        return ""
    return f"  (replaced or moved at {function.died:.6f}s)"


@command.command("convert")
@click.argument("dump", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="ELF file to write [default: jit-PID.elf].")
@click.option("--max-size", type=int, default=DEFAULT_MAX_SIZE, show_default=True, help="Refuse larger inputs.")
def convert(dump: str, output: str | None, max_size: int) -> None:
    """Write an ELF file (sections per JIT region, symbols, code, build-id) from a jitdump or perf map."""
    with _open_named(dump, max_size) as fd:
        if _is_jitdump(fd):
            header, records, _ = _read_dump(fd, dump)
            functions, pid = from_jitdump(header, records), header.pid
            mach, order, regions = header.elf_mach, header.byte_order, _regions(pid, dump, functions)
            times_are_lines = False
        else:
            functions, pid = from_perf_map(read_perf_map(fd)[0]), _pid_from_name(dump)
            mach, order, regions = host_elf_machine(), "<", page_regions(functions)
            times_are_lines = True
    if not functions:
        raise OptraceError(f"{dump}: no JIT functions in it, nothing to convert")
    out = output or f"jit-{pid}.elf"
    try:
        summary = write_elf(out, functions, mach, regions, order, times_are_lines)
    except OSError as exc:
        raise OptraceError(f"cannot write {out}: {exc.strerror}") from None
    click.echo(f"wrote {summary.path}: {len(summary.sections)} code sections, {summary.symbols} symbols, "
               f"build-id {summary.build_id}")


def _regions(pid: int, dump: str, functions: list[JitFunction]) -> list[tuple[int, int]]:
    """The live process's anonymous executable mappings when it still runs with this dump mapped."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        maps = ""
    regions = live_regions(maps, functions) if os.path.basename(dump) in maps else []
    uncovered = [f for f in functions if not any(lo <= f.start < hi for lo, hi in regions)]
    return sorted(regions + page_regions(uncovered))


def _pid_from_name(path: str) -> int:
    digits = "".join(ch for ch in os.path.basename(path) if ch.isdigit())
    return int(digits) if digits else 0
