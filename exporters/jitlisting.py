"""`optrace jit show`: a perf map or jitdump listed one entry or record a line (address, size, name,
load time, moves and replacements). Every name and path goes through
:func:`~optrace.escape.escape_controls`: a name is whatever the JIT wrote, terminal escapes included."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TextIO

from optrace.escape import escape_controls
from optrace.frontend.report.jitlisting import JitDumpListing, Listing, PerfMapListing, skipped_note
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.lifetimes import JitClock, JitFunction, from_perf_map, jitdump_clock, jitdump_timeline
from optrace.jitmaps.perfmap import MAX_LINE

ELF_MACHINES = {3: "x86", 62: "x86-64", 40: "arm", 183: "aarch64", 243: "riscv", 21: "ppc64"}


def write(stream: TextIO, listing: Listing, options: None) -> None:
    """A listing has nothing to choose: ``options`` is always None."""
    lines = _jitdump_lines(listing) if isinstance(listing, JitDumpListing) else _perf_map_lines(listing)
    for line in lines:
        stream.write(line + "\n")


def _perf_map_lines(listing: PerfMapListing) -> Iterator[str]:
    reader, kept = listing.reader, len(listing.entries)
    long_lines = f" ({reader.long_lines} over {MAX_LINE} bytes)" if reader.long_lines else ""
    yield (f"perf map {escape_controls(listing.path)}: {kept + listing.skipped} entries, {reader.bad_lines} bad "
           f"lines skipped{long_lines}{skipped_note(kept, listing.skipped, 'entries')}")
    yield f"{'LINE':>7}  {'ADDRESS':<18}  {'SIZE':>8}  NAME"
    for line, function in enumerate(from_perf_map(listing.entries), 1):
        replaced = "" if function.died is None else f"  (replaced at entry {function.died:.0f})"
        yield f"{line:>7}  0x{function.start:016x}  {function.size:>#8x}  {escape_controls(function.name)}{replaced}"


def _jitdump_lines(listing: JitDumpListing) -> Iterator[str]:
    header, records, reader = listing.header, listing.records, listing.reader
    clock = jitdump_clock(header, records)
    order = "little" if header.byte_order == "<" else "big"
    origin = f" ({clock.origin_note})" if clock.origin_note else ""
    yield (f"jitdump {escape_controls(listing.path)}: pid {header.pid}, version {header.version}, "
           f"{ELF_MACHINES.get(header.elf_mach, 'elf_mach ' + str(header.elf_mach))}, {order}-endian, "
           f"{clock.name} clock{origin}, {reader.records} records ({reader.unknown_records} unknown skipped, "
           f"{reader.truncated_bytes} truncated bytes at the end"
           f"{skipped_note(len(records), listing.skipped, 'records')})")
    yield f"{f'TIME({clock.unit})':>12}  {'EVENT':<6}  {'ADDRESS':<18}  {'SIZE':>8}  NAME"
    functions, created = jitdump_timeline(header, records)
    for record, function_id in zip(records, created):
        function = None if function_id is None else functions[function_id]
        yield f"{_time(clock, clock.age(record.timestamp))}  " + _describe(record, function, clock)


def _time(clock: JitClock, age: float) -> str:
    return f"{age:>12.6f}" if clock.unit == "s" else f"{age:>12.0f}"


def _describe(record: jd.JitRecord, function: JitFunction | None, clock: JitClock) -> str:
    if isinstance(record, jd.CodeLoad):
        extra = " [code]" if record.code and any(record.code) else ""
        return (f"load    0x{record.code_addr:016x}  {record.code_size:>#8x}  {escape_controls(record.name)}{extra}"
                f"{_fate(function, clock)}")
    if isinstance(record, jd.CodeMove):
        return (f"move    0x{record.new_code_addr:016x}  {record.code_size:>#8x}  "
                f"from 0x{record.old_code_addr:x} (code #{record.code_index}){_fate(function, clock)}")
    if isinstance(record, jd.DebugInfo):
        files = sorted({escape_controls(e.filename) for e in record.entries})
        lines = [e.lineno for e in record.entries]
        where = f"{', '.join(files)}:{min(lines)}-{max(lines)}" if lines else "no lines"
        return f"debug   0x{record.code_addr:016x}  {len(record.entries):>8}  lines in {where}"
    if isinstance(record, jd.UnwindingInfo):
        return f"unwind  {'':<18}  {record.unwinding_size:>#8x}  eh_frame_hdr {record.eh_frame_hdr_size:#x}"
    return "close"


def _fate(function: JitFunction | None, clock: JitClock) -> str:
    if function is None or function.died is None:
        return ""
    return f"  (replaced or moved at {_time(clock, function.died).strip()}{clock.unit})"
