"""`optrace jit show` and `optrace jit convert`: listings, an ELF that readelf, objdump and pyelftools read,
lifetimes for reused addresses, and one-line errors for bad input."""
from __future__ import annotations

import os
import subprocess

import pytest
from elftools.elf.elffile import ELFFile

from jithelpers import dump_bytes, load
from optrace.jitmaps import jitdump as jd

NS = 1_000_000_000
RET_NOPS = b"\x90\x90\x90\xc3"
REUSE = [
    jd.DebugInfo(NS, 0x7F0000001000, (jd.DebugEntry(0x7F0000001000, 12, 0, "app.js"),)),
    load(0x7F0000001000, 4, "A(int)", NS, 0, RET_NOPS),
    load(0x7F0000001100, 4, "other", NS, 1, b"\xcc\xcc\xcc\xc3"),
    load(0x7F0000001000, 4, "B(int)", 2 * NS, 2, b"\x31\xc0\x90\xc3"),
    jd.CodeMove(3 * NS, 42, 42, 0x7F0000009000, 0x7F0000001100, 0x7F0000009000, 4, 1),
    jd.CodeClose(4 * NS),
]


@pytest.fixture
def dump(tmp_path):
    path = tmp_path / "jit-42.dump"
    path.write_bytes(dump_bytes(REUSE, header_ts=NS // 2))
    return path


def test_show_jitdump(optrace, dump):
    out = optrace("jit", "show", str(dump), check=True).stdout
    assert "pid 42, version 1, x86-64, little-endian, CLOCK_MONOTONIC clock, 6 records" in out
    assert "load    0x00007f0000001000       0x4  A(int) [code]  (replaced or moved at 1.500000s)" in out
    assert "debug   0x00007f0000001000         1  lines in app.js:12-12" in out
    assert "move    0x00007f0000009000       0x4  from 0x7f0000001100 (code #1)" in out
    assert out.rstrip().endswith("close")


def test_show_perf_map(optrace, tmp_path):
    path = tmp_path / "perf-7.map"
    path.write_text("0x1000 0x10 long Hot.f(long)\nbad line\n1000 8 g\n2000 4 tail")
    out = optrace("jit", "show", str(path), check=True).stdout
    assert "perf map" in out and "3 entries, 1 bad lines skipped" in out
    assert "0x0000000000001000      0x10  long Hot.f(long)  (replaced at entry 2)" in out
    assert "tail" in out


def test_convert_readable_by_readelf_objdump_pyelftools(optrace, dump, tmp_path):
    out_path = tmp_path / "out.elf"
    msg = optrace("jit", "convert", str(dump), "-o", str(out_path), check=True).stdout
    assert "2 code sections, 4 symbols" in msg
    symbols = subprocess.run(["readelf", "-sW", str(out_path)], check=True, capture_output=True, text=True).stdout
    assert "A(int)@0.500000s..1.500000s" in symbols  # replaced by B: its lifetime is in its name
    assert "other@0.500000s..2.500000s" in symbols  # moved away at 2.5 s
    names = [line.split()[-1] for line in symbols.splitlines() if " FUNC " in line]
    assert names == ["A(int)@0.500000s..1.500000s", "other@0.500000s..2.500000s", "B(int)", "other"]
    assert [line.split()[4] for line in symbols.splitlines() if " FUNC " in line] == ["LOCAL"] * 2 + ["GLOBAL"] * 2
    notes = subprocess.run(["readelf", "-nW", str(out_path)], check=True, capture_output=True, text=True).stdout
    assert "NT_GNU_BUILD_ID" in notes
    disasm = subprocess.run(["objdump", "-d", str(out_path)], check=True, capture_output=True, text=True).stdout
    assert "<B(int)>:" in disasm and "xor    %eax,%eax" in disasm  # the final bytes at the reused address
    assert "7f0000009000 <other>:" in disasm and "int3" in disasm  # the moved code kept its bytes
    with open(out_path, "rb") as f:
        elf = ELFFile(f)
        sections = {s.name: s for s in elf.iter_sections()}
        text = sections[".jit.0x7f0000001000"]
        assert text["sh_addr"] == 0x7F0000001000 and text["sh_flags"] & 0x6 == 0x6
        assert text.data()[:4] == b"\x31\xc0\x90\xc3" and text.data()[0x100:0x104] == b"\xcc\xcc\xcc\xc3"
        by_name = {s.name: s for s in sections[".symtab"].iter_symbols()}
        assert by_name["B(int)"]["st_value"] == 0x7F0000001000 and by_name["B(int)"]["st_size"] == 4
        note = next(iter(sections[".note.gnu.build-id"].iter_notes()))
        assert note["n_type"] == "NT_GNU_BUILD_ID" and len(note["n_desc"]) == 40


def test_convert_big_endian_dump(optrace, tmp_path):
    path = tmp_path / "jit-42.dump"
    path.write_bytes(dump_bytes(REUSE[:2], order=">"))
    out_path = tmp_path / "be.elf"
    optrace("jit", "convert", str(path), "-o", str(out_path), check=True)
    with open(out_path, "rb") as f:
        elf = ELFFile(f)
        assert not elf.little_endian
        assert [s.name for s in elf.get_section_by_name(".symtab").iter_symbols()][1:] == ["A(int)"]


def test_convert_perf_map_symbols_only(optrace, tmp_path):
    path = tmp_path / "perf-7.map"
    path.write_text("7f0000001000 10 f\n7f0000001000 8 g\n")
    out_path = tmp_path / "map.elf"
    optrace("jit", "convert", str(path), "-o", str(out_path), check=True)
    symbols = subprocess.run(["readelf", "-sW", str(out_path)], check=True, capture_output=True, text=True).stdout
    assert "f@line1..line2" in symbols and " g" in symbols
    sections = subprocess.run(["readelf", "-SW", str(out_path)], check=True, capture_output=True, text=True).stdout
    assert "NOBITS" in sections  # no code bytes in a perf map


@pytest.mark.parametrize("content,message", [
    (b"JiTD" + bytes(10), "truncated header"),
    (dump_bytes([])[:4] + b"\x09\0\0\0" + dump_bytes([])[8:], "unsupported jitdump version 9"),
], ids=["truncated-header", "version-9"])
def test_bad_input_one_line_error(optrace, tmp_path, content, message):
    path = tmp_path / "bad.dump"
    path.write_bytes(content)
    for args in (["show", str(path)], ["convert", str(path), "-o", str(tmp_path / "x.elf")]):
        proc = optrace("jit", *args)
        assert proc.returncode != 0 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and message in proc.stderr and proc.stderr.startswith("optrace: ")


def test_missing_directory_and_empty_inputs(optrace, tmp_path):
    for args, message in [(["show", str(tmp_path / "nope")], "no such file"),
                          (["show", str(tmp_path)], "is a directory"),
                          (["convert", os.devnull], "not a regular file")]:
        proc = optrace("jit", *args)
        assert proc.returncode != 0 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    empty = tmp_path / "perf-1.map"
    empty.write_text("")
    proc = optrace("jit", "convert", str(empty))
    assert proc.returncode != 0 and "no JIT functions" in proc.stderr


def test_convert_a_live_process_dump_uses_its_mappings(optrace, spawn, tmp_path):
    """While the process runs, the section is its anonymous executable mapping (trimmed to the code)."""
    from jithelpers import PROGRAMS, PYTHON
    proc = spawn([PYTHON, str(PROGRAMS / "reuse.py"), "30", "--dump-dir", str(tmp_path)],
                 stdout=subprocess.PIPE, text=True)
    address, dump = proc.stdout.readline().split()
    out_path = tmp_path / "live.elf"
    optrace("jit", "convert", dump, "-o", str(out_path), check=True)
    with open(out_path, "rb") as f:
        (section,) = [s for s in ELFFile(f).iter_sections() if s.name.startswith(".jit.")]
        assert section["sh_addr"] == int(address, 16) and section["sh_size"] == 9
        assert section.data()[:3] == b"\x48\x89\xf8"
