"""`count BINARY:0xADDRESS` accepts only function starts and instruction boundaries inside functions.

The oracle is binutils' objdump (independent of the capstone decoder optrace uses): every byte address
of two functions of the bundled `calls` workload is tried, and exactly objdump's instruction starts are
accepted. Crafted copies of the binary cover the other machines, undecodable code, and the decode cap.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from optrace.errors import OptraceError
from optrace.frontend.uprobes import address as address_module
from optrace.frontend.uprobes.resolve import resolve_specs
from support import assert_one_line_error

EM_AARCH64 = 183
E_MACHINE_OFFSET = 18


def symbols(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (address, size) of the code symbols, as nm prints them (size 0 when it has none)."""
    out = subprocess.run(["nm", "-S", str(path)], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) in (3, 4) and fields[-2] in "tTwW":
            size = int(fields[1], 16) if len(fields) == 4 else 0
            found[fields[-1]] = (int(fields[0], 16), size)
    return found


def instruction_starts(path: Path, function: str) -> list[int]:
    """Where objdump says the instructions of `function` start."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={function}", str(path)],
                         capture_output=True, text=True, check=True).stdout
    body = out.split(f"<{function}>:", 1)[1]
    return [int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):\s", body, re.MULTILINE)]


def call_site(path: Path, caller: str, callee: str) -> int:
    """The address of the (5-byte, direct) call of `callee` in `caller`."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={caller}", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(rf"^\s+([0-9a-f]+):\s+call\s+[0-9a-f]+ <{callee}>", out, re.MULTILINE).group(1), 16)


def resolve_error(spec: str) -> str:
    with pytest.raises(OptraceError) as caught:
        resolve_specs([spec])
    return str(caught.value)


def patched_copy(source: Path, target: Path, at: int, data: bytes) -> Path:
    blob = bytearray(source.read_bytes())
    blob[at:at + len(data)] = data
    target.write_bytes(bytes(blob))
    return target


# The name a probe shows is the symbolizer's (perf's) choice among aliases: of target and target_alias
# (both global and sized), the longer.
SHOWN = {"main": "main", "target": "target_alias"}


@pytest.mark.parametrize("binary, load_base", [("calls", 0), ("calls-nopie", 0x400000)])
@pytest.mark.parametrize("function", ["main", "target"])
def test_exactly_the_instruction_starts_are_accepted(workloads, binary, load_base, function):
    path = workloads / binary
    start, size = symbols(path)[function]
    boundaries = set(instruction_starts(path, function))
    assert start in boundaries and len(boundaries) >= 4
    accepted = set()
    for address in range(start, start + size):
        try:
            probe = resolve_specs([f"{path}:{address:#x}"]).probes[0]
        except OptraceError as exc:
            assert "is inside the instruction at" in str(exc), exc
            continue
        accepted.add(address)
        assert probe.offset == address - load_base
        assert probe.symbol == (SHOWN[function] if address == start else f"{SHOWN[function]}+{address - start:#x}")
    assert accepted == boundaries


def test_inside_an_instruction_names_both_neighbouring_boundaries(workloads):
    calls = workloads / "calls"
    call = call_site(calls, "main", "target")
    message = resolve_error(f"{calls}:{call + 2:#x}")
    assert message == (f"address {call + 2:#x} is inside the instruction at {call:#x} of main (5 bytes) in "
                       f"{calls.resolve()}: use {call:#x} or {call + 5:#x}")


def test_inside_the_last_instruction_offers_only_its_start(workloads):
    calls = workloads / "calls"
    start, size = symbols(calls)["target"]
    last = instruction_starts(calls, "target")[-2]  # the instruction before the 1-byte ret
    message = resolve_error(f"{calls}:{last + 1:#x}")
    assert message.endswith(f"use {last:#x} or {start + size - 1:#x}")


def test_after_ret_outside_every_function(workloads):
    calls = workloads / "calls"
    names = symbols(calls)
    start, size = names["target"]
    following = min((a, n) for n, (a, _s) in names.items() if a > start)
    assert following[0] > start + size, "no padding after target in this build"
    message = resolve_error(f"{calls}:{start + size:#x}")
    assert message == (f"address {start + size:#x} is not inside any function of {calls.resolve()} "
                       f"(after target_alias ends at {start + size:#x}): nearest function starts: "
                       f"{start:#x} (target_alias), {following[0]:#x} ({following[1]})")


def test_other_machines_accept_function_starts_only(workloads, tmp_path):
    arm = patched_copy(workloads / "calls", tmp_path / "calls-arm", E_MACHINE_OFFSET,
                       EM_AARCH64.to_bytes(2, "little"))
    start, _size = symbols(arm)["target"]
    assert resolve_specs([f"{arm}:{start:#x}"]).probes[0].symbol == "target_alias"
    boundary = instruction_starts(workloads / "calls", "target")[1]
    message = resolve_error(f"{arm}:{boundary:#x}")
    assert message == (f"address {boundary:#x} (target_alias+{boundary - start:#x}) in {arm}: only function starts "
                       f"can be probed by address in EM_AARCH64 code (instructions are decoded for x86-64 "
                       f"only): use {start:#x}")


def test_code_that_does_not_decode_is_refused(workloads, tmp_path):
    """0x06 (push es) is no instruction in 64-bit mode: nothing after it can be checked."""
    calls = workloads / "calls"
    start, _size = symbols(calls)["main"]
    boundaries = instruction_starts(calls, "main")
    broken = patched_copy(calls, tmp_path / "calls-broken", boundaries[2], b"\x06")
    assert resolve_specs([f"{broken}:{boundaries[1]:#x}"]).probes  # before the bad byte: still checked
    message = resolve_error(f"{broken}:{boundaries[3]:#x}")
    assert message == (f"address {boundaries[3]:#x} in main of {broken} cannot be checked: the code from "
                       f"{start:#x} does not decode as x86-64 past {boundaries[2]:#x}; probe {start:#x} "
                       "(main) instead")


def test_decoding_is_capped(workloads, monkeypatch):
    calls = workloads / "calls"
    start, _size = symbols(calls)["main"]
    far = next(a for a in instruction_starts(calls, "main") if a - start > 64)
    monkeypatch.setattr(address_module, "MAX_DECODE_BYTES", 64)
    message = resolve_error(f"{calls}:{far:#x}")
    assert message == (f"address {far:#x} is {far - start} bytes into main in {calls.resolve()}, past the 64 "
                       "bytes optrace decodes to check it is an instruction boundary")


def test_code_beyond_the_end_of_the_file_is_an_error(workloads, tmp_path):
    """Symbols intact, the executable segment's file offset moved past the end of the file: nothing is
    guessed, the missing bytes are an error."""
    calls = workloads / "calls"
    boundary = instruction_starts(calls, "main")[4]
    with open(calls, "rb") as f:
        elf = ELFFile(f)
        index = next(i for i, seg in enumerate(elf.iter_segments())
                     if seg["p_type"] == "PT_LOAD" and seg["p_flags"] & 1)
        at = elf["e_phoff"] + index * elf["e_phentsize"] + 8  # Elf64_Phdr.p_offset
        text = elf.get_segment(index)
    moved = text["p_offset"] + (1 << 30)
    cut = patched_copy(calls, tmp_path / "calls-cut", at, moved.to_bytes(8, "little"))
    main_offset = moved + symbols(calls)["main"][0] - text["p_vaddr"]
    message = resolve_error(f"{cut}:{boundary:#x}")
    assert message == f"{cut} is truncated: its code at file offset {main_offset:#x} is missing"


@pytest.mark.parametrize("make, detail", [
    (lambda p: os.mkfifo(p), "is not a regular file"),
    (lambda p: os.mkdir(p), "is a directory"),
    (lambda p: p.symlink_to("/proc/self/status"), "is on procfs, not a disk file system"),
])
def test_non_regular_and_pseudo_files_are_refused(tmp_path, make, detail):
    path = tmp_path / "binary"
    make(path)
    message = resolve_error(f"{path}:main")
    assert message.startswith("cannot use ") and message.endswith(detail), message


def test_cli_refuses_a_mid_instruction_address_in_one_line(workloads, optrace):
    calls = workloads / "calls"
    call = call_site(calls, "main", "target")
    assert_one_line_error(optrace("count", f"{calls}:{call + 1:#x}", "-d", "1"),
                          f"optrace: address {call + 1:#x} is inside the instruction at {call:#x}",
                          f"use {call:#x} or {call + 5:#x}")
    start, size = symbols(calls)["target"]
    assert_one_line_error(optrace("count", f"{calls}:{start + size:#x}", "-d", "1"),
                          f"is not inside any function of {calls.resolve()} (after target_alias ends")
