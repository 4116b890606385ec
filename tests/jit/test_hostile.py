"""Issue 8's rows about JIT files, one test each: perf-map lines that made the old expression backtrack,
`jit convert` of a tiny map naming a huge range, jitdumps that gave internal errors, terminal escapes in
names, `jit convert -o` through a planted symlink, FIFOs planted where the agent API writes, and the
symbol budget against a million distinct names."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from jithelpers import PYTHON, dump_bytes, load, needs_root
from optrace.errors import OptraceError
from optrace.frontend.commands.jit import command as jit_command
from optrace.jitmaps import jitdump as jd
from optrace.jitmaps.jitsymbols import READ_BUDGET
from optrace.jitmaps.perfmap import CHUNK
from optrace.jitmaps.perfmap import MAX_LINE, PerfMapReader
from optrace.jitmaps.symtable import SymbolBudget, SymbolHistory

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"


def jit(*args: str):
    """`optrace jit ...` in this process: (exit status, output, the OptraceError or None)."""
    result = CliRunner().invoke(jit_command, list(args), standalone_mode=False, catch_exceptions=True)
    error = result.exception
    if error is not None and not isinstance(error, OptraceError):
        raise error
    return (1 if error else 0), result.output, error


def read_map(path) -> tuple[list, PerfMapReader, float]:
    fd = os.open(path, os.O_RDONLY)
    started = time.perf_counter()
    try:
        reader = PerfMapReader()
        entries = list(reader.read_new(fd, final=True))
    finally:
        os.close(fd)
    return entries, reader, time.perf_counter() - started


# -- perf-map parsing is linear ----------------------------------------------------------------------------
def test_a_line_of_150000_blanks_parses_in_milliseconds(tmp_path):
    path = tmp_path / "perf-1.map"
    path.write_bytes(b"1 1" + b" " * 150_000 + b"\n1000 10 after\n")
    entries, reader, took = read_map(path)
    assert [e.name for e in entries] == ["after"]
    assert (reader.lines, reader.bad_lines, reader.long_lines) == (2, 1, 1)
    assert took < 0.5, took  # measured: 0.2 ms (the expression before issue 8: ~100 s)


def test_ten_megabytes_of_hostile_lines_in_well_under_a_second(tmp_path):
    """Long blank runs, hex runs and blank lines, with and without newlines, some just under the cap."""
    path = tmp_path / "perf-1.map"
    parts = [b"1 1" + b" " * 150_000 + b"\n", b"1" + b" " * (MAX_LINE - 8) + b"zz\n", b"f" * 40_000 + b"\n",
             b" \t " * 1000 + b"\n", b"1 1 " + b"x" * (MAX_LINE - 4) + b"\n"]
    repeats = 10_000_000 // sum(map(len, parts))
    path.write_bytes(b"".join(parts) * repeats + b" " * 3_000_000)  # and an unterminated line of blanks
    entries, reader, took = read_map(path)
    assert path.stat().st_size > 12_000_000 and took < 1.0, took  # measured: 0.03-0.06 s (load average ~45 on 2 CPUs)
    assert len(entries) == repeats  # the last part, exactly MAX_LINE bytes long, is a good line
    assert (reader.lines, reader.bad_lines, reader.long_lines) == (4 * repeats + 1, 3 * repeats + 1, 2 * repeats + 1)


def test_lines_over_the_cap_are_bad_lines_even_across_reads(tmp_path, monkeypatch):
    import optrace.jitmaps.perfmap as perfmap
    monkeypatch.setattr(perfmap, "CHUNK", 1000)
    path = tmp_path / "perf-1.map"
    long_name = "n" * (MAX_LINE + 1)
    path.write_text(f"1000 10 ok\n2000 10 {long_name}\n3000 10 {'m' * (MAX_LINE - 20)}\n4000 10 end")
    entries, reader, _ = read_map(path)
    assert [e.name[:3] for e in entries] == ["ok", "mmm", "end"]
    assert (reader.lines, reader.bad_lines, reader.long_lines) == (4, 1, 1)


def test_jit_show_on_a_40_kb_line_is_fast(tmp_path):
    path = tmp_path / "perf-1.map"
    path.write_bytes(b"1 1 " + b" " * 40_000 + b"x\n1000 10 f\n")
    started = time.perf_counter()
    status, out, _ = jit("show", str(path))
    took = time.perf_counter() - started
    assert status == 0 and "1 entries, 1 bad lines skipped (1 over 16384 bytes)" in out
    assert took < 1.0, took  # before issue 8: 9.6 s


# -- jit convert is bounded by what the file holds --------------------------------------------------------
@pytest.mark.parametrize("line", ["0 200000000 x", "0 fffffffffffff000 x", "fffffffffffff000 fff x",
                                  "7f0000000000 1 a\n7f0100000000 1 b"])
def test_convert_of_a_tiny_map_naming_a_huge_range(tmp_path, line):
    path = tmp_path / "perf-9.map"
    path.write_text(line + "\n")
    out = tmp_path / "out.elf"
    started = time.perf_counter()
    status, text, error = jit("convert", str(path), "-o", str(out))
    assert status == 0, error
    assert time.perf_counter() - started < 2 and out.stat().st_size < 4096
    sections = subprocess.run(["readelf", "-SW", str(out)], check=True, capture_output=True, text=True).stdout
    assert "NOBITS" in sections and "PROGBITS" not in sections


def test_convert_allocates_only_the_code_the_dump_carries(tmp_path):
    """Two 4-byte functions with code 64 GiB apart and a code-less one spanning them: two small sections."""
    records = [load(0x1000, 4, "low", 1, 0, b"\x90\x90\x90\xc3"),
               load(0x1000000000, 4, "high", 2, 1, b"\xcc\xcc\xcc\xc3"),
               jd.encode_record(jd.CODE_LOAD, 3, struct.pack("<IIQQQQ", 42, 42, 0, 0, 0x2000000000, 2) + b"big\0")]
    path = tmp_path / "jit-42.dump"
    path.write_bytes(dump_bytes(records))
    out = tmp_path / "out.elf"
    status, text, error = jit("convert", str(path), "-o", str(out))
    assert status == 0, error
    assert "3 code sections, 3 symbols" in text and out.stat().st_size < 16384


def test_code_and_a_huge_code_less_function_at_the_same_page(tmp_path):
    """The code-less function's NOBITS region starts where the code's region does: the code's bytes go
    to the small region, nothing spans the 1 TiB."""
    records = [jd.encode_record(jd.CODE_LOAD, 1, struct.pack("<IIQQQQ", 42, 42, 0, 0x1000, 1 << 40, 0) + b"big\0"),
               load(0x1000, 4, "small", 2, 1, b"\x31\xc0\x90\xc3")]
    path = tmp_path / "jit-42.dump"
    path.write_bytes(dump_bytes(records))
    out = tmp_path / "out.elf"
    status, text, error = jit("convert", str(path), "-o", str(out))
    assert status == 0 and out.stat().st_size < 16384, error
    disasm = subprocess.run(["objdump", "-d", str(out)], check=True, capture_output=True, text=True).stdout
    assert "<small>:" in disasm and "xor    %eax,%eax" in disasm


def test_too_many_separate_regions_is_one_line_error(tmp_path, monkeypatch):
    import optrace.jitmaps.elfwriter as elfwriter
    monkeypatch.setattr(elfwriter, "MAX_SECTIONS", 10)
    path = tmp_path / "perf-9.map"
    path.write_text("".join(f"{i << 20:x} 10 f{i}\n" for i in range(1, 12)))
    status, _, error = jit("convert", str(path), "-o", str(tmp_path / "out.elf"))
    assert status == 1 and "spread over 11 separate regions" in str(error)
    assert not (tmp_path / "out.elf").exists()


# -- jitdumps that gave internal errors --------------------------------------------------------------------
HUGE = 10**19  # over 2**63: what `count records with 10**400` and some jitdumps turned into OverflowError


@pytest.mark.parametrize("records,message", [
    ([jd.CodeMove(1, 42, 42, 0, 0x9000, 0xA000, 4, 7), load(0x1000, 4, "after", 2)], None),  # StopIteration
    ([load(2**64 - 2, 4, "wraps", 1)], "past the end of the address space"),
    ([jd.CodeMove(1, 42, 42, 0, 0, 2**64 - 8, 16, 0)], "past the end of the address space"),
    ([struct.pack("<IIQ", 0, 0xFFFFFFFF, 0) + bytes(100)], None),  # a record size past the end: truncated
    ([struct.pack("<IIQ", 2, 40, 0) + struct.pack("<QQ", 0, HUGE) + bytes(8)], "fewer entries"),
    ([load(0x1000, HUGE % 2**64 // 2**20, "size-only", 1, code=b"")], None),
], ids=["move-before-load", "load-wraps", "move-wraps", "huge-record-size", "debug-count", "huge-size-no-code"])
def test_malformed_jitdumps_are_one_line_errors_or_shown(tmp_path, records, message):
    path = tmp_path / "jit-42.dump"
    path.write_bytes(dump_bytes(records, header_ts=5))
    for args in (["show", str(path)], ["convert", str(path), "-o", str(tmp_path / "out.elf")]):
        status, out, error = jit(*args)
        if message:
            assert status == 1 and message in str(error) and "\n" not in str(error)
        else:
            assert status == 0 or "no JIT functions" in str(error), error
    assert "-0.0" not in out and " -" not in out  # a record stamped before its header: age 0, never negative


def test_convert_of_a_dump_whose_machine_is_not_16_bits(tmp_path):
    path = tmp_path / "jit-42.dump"
    path.write_bytes(jd.encode_header(42, 0xFFFF_FFFF, 0) + jd.encode_load(load(0x1000, 4, "f", 1)))
    status, _, error = jit("convert", str(path), "-o", str(tmp_path / "out.elf"))
    assert status == 1 and "machine 4294967295 is not an ELF machine number" in str(error)
    status, out, _ = jit("show", str(path))
    assert status == 0 and "elf_mach 4294967295" in out


def test_header_size_past_the_file_and_huge_header_fields(tmp_path):
    header = bytearray(jd.encode_header(2**32 - 1, 65535, 2**64 - 1))
    struct.pack_into("<I", header, 8, 1 << 20)
    path = tmp_path / "jit-1.dump"
    path.write_bytes(bytes(header) + bytes(64))
    status, out, _ = jit("show", str(path))
    assert status == 0 and "pid 4294967295" in out and "0 records" in out


# -- terminal escapes --------------------------------------------------------------------------------------
def test_escapes_in_names_are_not_sent_to_the_terminal(tmp_path):
    path = tmp_path / "perf-3.map"
    path.write_text(f"1000 10 evil{ESCAPES}name\n")
    dump = tmp_path / "jit-42.dump"
    dump.write_bytes(dump_bytes([jd.DebugInfo(1, 0x1000, (jd.DebugEntry(0x1000, 1, 0, f"f{ESCAPES}.js"),)),
                                 load(0x1000, 4, f"g{ESCAPES}", 2)]))
    for target in (path, dump):
        status, out, _ = jit("show", str(target))
        assert status == 0 and "\x1b" not in out and "\x07" not in out
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in out


# -- output files ------------------------------------------------------------------------------------------
def test_convert_output_never_follows_a_planted_symlink(tmp_path):
    needs_root()
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    planted = tmp_path / "out.elf"
    planted.symlink_to(victim)
    source = tmp_path / "perf-5.map"
    source.write_text("1000 10 f\n")
    status, _, error = jit("convert", str(source), "-o", str(planted))
    assert status == 0, error
    assert victim.read_text() == "precious\n"
    assert not planted.is_symlink() and planted.read_bytes()[:4] == b"\x7fELF"


# -- the agent API against planted files --------------------------------------------------------------------
AGENT_CHILD = textwrap.dedent("""
    import os, sys, threading
    from optrace.jitmaps.agent import AgentError, open_agent
    where, kind = sys.argv[1], sys.argv[2]
    dump_dir = os.path.join(where, "dumps")
    os.makedirs(dump_dir, exist_ok=True)
    target = (os.path.join(where, f"perf-{os.getpid()}.map") if kind.startswith("map")
              else os.path.join(dump_dir, f"jit-{os.getpid()}.dump"))
    if kind.endswith("fifo") or kind.endswith("fifo-read"):
        os.mkfifo(target)
        if kind.endswith("fifo-read"):  # someone holds it open for reading: the open would succeed
            reader = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    elif kind.endswith("hardlink"):
        other = os.path.join(where, "other")
        open(other, "w").close()
        os.link(other, target)
    try:
        open_agent(perf_map_dir=where, dump_dir=dump_dir).close()
    except AgentError as exc:
        print("AgentError:", exc)
        sys.exit(3)
    print("opened")
""")


@pytest.mark.parametrize("kind", ["map-fifo", "map-fifo-read", "map-hardlink", "dump-fifo", "dump-fifo-read"])
def test_agent_refuses_planted_files_promptly(tmp_path, kind):
    proc = subprocess.run([PYTHON, "-c", AGENT_CHILD, str(tmp_path), kind], capture_output=True, text=True,
                          timeout=20)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("AgentError:") and "remove it" in proc.stdout


def test_agent_in_tmp_with_a_planted_fifo(spawn):
    """The real path: /tmp/perf-PID.map planted as a FIFO before the process opens the agent."""
    script = ("import os, sys; p = f'/tmp/perf-{os.getpid()}.map'; os.mkfifo(p)\n"
              "from optrace.jitmaps.agent import AgentError, open_agent\n"
              "try:\n    open_agent(jitdump=False)\nexcept AgentError as exc:\n    print(exc); sys.exit(3)\n")
    proc = spawn([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 3 and f"/tmp/perf-{proc.pid}.map exists" in out


def test_agent_reuses_its_own_existing_map(tmp_path):
    script = ("import os; p = f'{sys.argv[1]}/perf-{os.getpid()}.map'; open(p, 'w').write('1000 10 earlier\\n')\n"
              "from optrace.jitmaps.agent import open_agent\n"
              "with open_agent(perf_map_dir=sys.argv[1], jitdump=False) as a:\n    a.write_native_code('later', 0x2000, 16)\n"
              "print(open(p).read(), end='')\n")
    out = subprocess.run([PYTHON, "-c", "import sys\n" + script, str(tmp_path)], check=True, capture_output=True,
                         text=True, timeout=20).stdout
    assert out == "1000 10 earlier\n2000 10 later\n"


# -- a million distinct names --------------------------------------------------------------------------------
def test_symbol_budget_bounds_a_table_and_all_tables():
    budget = SymbolBudget(table_entries=1000, table_name_bytes=10_000, total_entries=1500, total_name_bytes=10**6)
    first, second = SymbolHistory(budget), SymbolHistory(budget)
    first.add_many(((i * 16, 16, f"f{i:08d}") for i in range(2000)), "a", 1.0)  # 9-char names: 1111 fit
    assert len(first) == 1000 and first.dropped == 1000 and first.name_bytes == 9000
    second.add_many(((i * 16, 16, "same") for i in range(2000)), "b", 1.0)
    assert len(second) == 500 and budget.entries == 1500 and budget.dropped == 2500
    first.release()
    assert budget.entries == 500 and budget.name_bytes == 4
    assert first.lookup(16 * 999 + 1, 1.0).name == "f00000999" and first.lookup(16 * 1000, 1.0) is None


def test_a_table_at_its_cap_first_drops_repeats():
    """A map rewritten again and again (jcmd Compiler.perfmap) keeps its symbols at the cap."""
    table = SymbolHistory(SymbolBudget(table_entries=1000))
    for _ in range(5):
        table.add_many(((i * 16, 16, f"f{i}") for i in range(400)), "m", 1.0)
    table.add_many(((0x100000 + i * 16, 16, f"new{i}") for i in range(100)), "m", 2.0)
    assert table.dropped == 0 and table.lookup(0x100000 + 16 * 99, 2.0).name == "new99"


@pytest.mark.slow
def test_a_million_distinct_200_byte_names_stay_bounded(tmp_path):
    """Serve-like: JitSymbols polls a live process whose map has 1,000,000 distinct 200-byte names, once per
    drain. Each poll reads at most its byte budget (so no drain is held up: one poll of the whole map took
    4.6 s), the table keeps what its symbol budget allows (32 MiB of names), counts the rest, and the
    process's peak RSS grows by well under the 1 GB the issue allows (measured: see the assertion message)."""
    script = textwrap.dedent("""
        import json, os, resource, subprocess, sys, time
        from optrace.jitmaps.jitsymbols import JitSymbols
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        sleeper = subprocess.Popen(["sleep", "60"])
        path = f"/tmp/perf-{sleeper.pid}.map"
        with open(path, "w") as f:
            for i in range(1_000_000):
                f.write(f"{0x7f0000000000 + i * 64:x} 40 {i:010d}{'n' * 190}\\n")
        jit = JitSymbols()
        reader = lambda: next(iter(jit._procs[sleeper.pid][0].sources.values())).reader
        size, steps, took, polls = os.path.getsize(path), [], 0.0, 0
        while polls == 0 or reader().offset < size:
            before_offset, started = reader().offset if polls else 0, time.perf_counter()
            jit.poll(sleeper.pid, 1.0 + polls)
            took, polls = max(took, time.perf_counter() - started), polls + 1
            steps.append(reader().offset - before_offset)
        sleeper.kill(); sleeper.wait()
        os.unlink(path)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        table = jit._procs[sleeper.pid][0].table
        print(json.dumps(dict(grew_mb=(after - before) / 1024, kept=len(table), dropped=table.dropped,
                              longest_poll_s=took, polls=polls, largest_step=max(steps),
                              warnings=jit.warnings, stats=dict(jit.stats))))
    """)
    import json
    out = subprocess.run([PYTHON, "-c", script], check=True, capture_output=True, text=True, timeout=300).stdout
    result = json.loads(out)
    assert result["kept"] + result["dropped"] == 1_000_000
    assert 150_000 < result["kept"] < 200_000  # 32 MiB / 200 bytes
    assert result["stats"]["symbols_dropped"] == result["dropped"]
    assert len(result["warnings"]) == 1 and "were dropped" in result["warnings"][0]
    assert result["grew_mb"] < 300, result
    assert result["largest_step"] <= READ_BUDGET + CHUNK and result["polls"] >= 200_000_000 // (READ_BUDGET + CHUNK)
    print(result)
