"""The hostile files of issue 8's table, as bytes or as patched copies of the user's own programs."""
from __future__ import annotations

import json
import struct
from pathlib import Path

from hostilekit import JIT_BASE, HostileUser, record_file_bytes

ESCAPES = "\x1b]0;pwned by a perf map\x07\x1b[2J\x1b[31m"
KMSG_LINK = "../../../../proc/kmsg"
BLANKS_LINE = b"1 1" + b" " * 150_000 + b"\n"
MILLION = 1_000_000
NAME_BYTES = 200


# -- ELF files ---------------------------------------------------------------------------------------------
def _section_headers(data: bytes) -> list[tuple[str, int]]:
    """(name, file offset of its Elf64_Shdr) of every section of a little-endian ELF64 file."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names_hdr = shoff + shstrndx * shentsize
    names_off, = struct.unpack_from("<Q", data, names_hdr + 24)
    found = []
    for index in range(shnum):
        header = shoff + index * shentsize
        name_off, = struct.unpack_from("<I", data, header)
        start = names_off + name_off
        found.append((data[start:data.index(b"\0", start)].decode(), header))
    return found


def with_symtab_link(user: HostileUser, source: Path, target: Path, link: int = 0xFFFF) -> Path:
    """A copy of ``source`` whose .symtab's sh_link (its string table's index) is ``link``: runs fine,
    its symbol table points at a section that does not exist."""
    data = bytearray(source.read_bytes())
    header = dict(_section_headers(bytes(data)))[".symtab"]
    struct.pack_into("<I", data, header + 40, link)
    return user.write(target, bytes(data), 0o755)


def debuglink_section(name: str, crc: int = 0) -> bytes:
    raw = name.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return raw + struct.pack("<I", crc)


def stripped_with_section(user: HostileUser, source: Path, target: Path, section: str, content: Path) -> Path:
    """``source`` stripped of its symbols, with ``section`` added from ``content`` (done by the user)."""
    user.run("strip", "--strip-all", "--remove-section=.gnu_debuglink", "-o", target, source)
    user.run("objcopy", f"--add-section={section}={content}", target)
    return target


def with_kmsg_debuglink(user: HostileUser, source: Path, target: Path) -> Path:
    """Stripped, its .gnu_debuglink names ``../../../../proc/kmsg`` (from its folder: the kernel log)."""
    link = user.write(user.home / "kmsg.debuglink", debuglink_section(KMSG_LINK))
    return stripped_with_section(user, source, target, ".gnu_debuglink", link)


def with_debugdata_bomb(user: HostileUser, source: Path, target: Path, zeros_xz: Path) -> Path:
    """Stripped, its MiniDebugInfo (.gnu_debugdata) is xz of 4 GiB of zeros."""
    bomb = user.write(user.home / "zeros.xz", zeros_xz.read_bytes())
    return stripped_with_section(user, source, target, ".gnu_debugdata", bomb)


# -- perf maps ---------------------------------------------------------------------------------------------
def blanks_map() -> bytes:
    """A valid line, then ``1 1`` and 150,000 blanks (the backtracking bomb)."""
    return f"{JIT_BASE:x} {1 << 24:x} hostile_blanks_jit\n".encode() + BLANKS_LINE


def million_names_map() -> bytes:
    """1,000,000 distinct 200-byte names, one per 16-byte slot of programs/jitburn.c's code."""
    lines = [f"{JIT_BASE + 16 * i:x} 10 " + f"hostile_{i:07d}_".ljust(NAME_BYTES, "n") for i in range(MILLION)]
    return ("\n".join(lines) + "\n").encode()


def escapes_map() -> bytes:
    return f"{JIT_BASE:x} {1 << 24:x} hostile{ESCAPES}escape\n".encode()


# -- record files ------------------------------------------------------------------------------------------
def tiny_lists_bomb(payload_bytes: int = (256 << 20) - 64) -> bytes:
    """A record file whose JSON is ``[[],[],...]``: about 260 KB compressed, within the 256 MiB cap."""
    count = (payload_bytes - 2) // 3
    payload = b"[" + b"[]," * count + b"[]]"
    return record_file_bytes(payload, 9)


def record_json(samples_count: int | str = 10, calls: int | str = 5) -> dict:
    """A small valid record as JSON (the model's field names), with chosen numbers."""
    return {
        "meta": {"optrace_version": "0.1.0", "hostname": "h", "kernel": "6.18", "started": 1.0e9,
                 "duration_s": 1.0, "frequency_hz": 99, "event": "cpu-clock", "total_samples": 10,
                 "warnings": []},
        "frames": [{"symbol": "main", "dso": "/usr/bin/x", "kernel": False, "address": 4096,
                    "resolved": True, "build_id": None}],
        "samples": [{"pid": 1, "comm": "x", "frames": [0], "count": samples_count}],
        "calls": [{"probe": "c:malloc", "binary": "/usr/lib/libc.so.6", "symbol": "malloc", "offset": 16,
                   "calls": calls, "per_pid": {"1": calls}, "comms": {"1": "x"}, "unattributed": 0}],
    }


def huge_number_records() -> dict[str, bytes]:
    """Record files with numbers no recording can hold: 10**400 where counts, pids, offsets go."""
    huge = 10 ** 400
    variants: dict[str, dict] = {
        "sample_count": record_json(samples_count=huge),
        "call_count": record_json(calls=huge),
    }
    total = record_json()
    total["meta"]["total_samples"] = huge
    variants["total_samples"] = total
    pid = record_json()
    pid["samples"][0]["pid"] = huge
    variants["pid"] = pid
    address = record_json()
    address["frames"][0]["address"] = huge
    variants["frame_address"] = address
    freq = record_json()
    freq["meta"]["frequency_hz"] = huge
    variants["frequency"] = freq
    return {name: record_file_bytes(json.dumps(doc).encode()) for name, doc in variants.items()}


# -- jitdumps ----------------------------------------------------------------------------------------------
JD_HEADER = "<IIIIIIQQ"
JD_PREFIX = "<IIQ"
CODE_LOAD, CODE_MOVE, CODE_DEBUG_INFO = 0, 1, 2


def _jd_header(pid: int = 4242, timestamp: int = 1000, elf_mach: int = 62) -> bytes:
    return struct.pack(JD_HEADER, 0x4A695444, 1, 40, elf_mach, 0, pid, timestamp, 0)


def _jd_record(rid: int, payload: bytes, timestamp: int = 2000) -> bytes:
    return struct.pack(JD_PREFIX, rid, 16 + len(payload), timestamp) + payload


def _jd_load(addr: int, size: int, index: int = 0, name: bytes = b"f", code: bytes = b"",
             timestamp: int = 2000) -> bytes:
    return _jd_record(CODE_LOAD, struct.pack("<IIQQQQ", 4242, 4242, addr, addr, size, index) + name + b"\0"
                      + code, timestamp)


def _jd_move(old: int, new: int, size: int, index: int = 0) -> bytes:
    return _jd_record(CODE_MOVE, struct.pack("<IIQQQQQ", 4242, 4242, new, old, new, size, index))


def broken_jitdumps() -> dict[str, bytes]:
    """Jitdumps that are valid in shape but not in sense: wrapping ranges, zero sizes, moves of nothing,
    absurd machines and timestamps."""
    top = (1 << 64) - 1
    good = _jd_load(0x7000_0000, 16, 0, b"good", b"\xc3" * 16)
    return {
        "zero_size_load": _jd_header() + _jd_load(0x7000_0000, 0) + good,
        "wrapping_load": _jd_header() + _jd_load(top - 8, 0x1000) + good,
        "whole_space_load": _jd_header() + _jd_load(0, top) + good,
        "move_of_nothing": _jd_header() + _jd_move(0x1234, top - 4, 0x100, 99) + good,
        "wrapping_move": _jd_header() + good + _jd_move(0x7000_0000, top - 2, 16, 0),
        "huge_machine": _jd_header(elf_mach=0xFFFF_FFFF) + good,
        "time_before_header": _jd_header(timestamp=top) + _jd_load(0x7000_0000, 16, 0, b"t", timestamp=0),
        "huge_debug_count": _jd_header() + _jd_record(CODE_DEBUG_INFO, struct.pack("<QQ", 0x7000_0000, top))
        + good,
        "huge_code_index": _jd_header() + _jd_load(0x7000_0000, 16, top, b"i", b"\x90" * 16),
        "pid_wraps": _jd_header(pid=0xFFFF_FFFF) + good,
    }


def huge_perf_map_range() -> bytes:
    """The 17-byte perf map of the table: one function of 0x200000000 bytes at 0."""
    return b"0 200000000 x\n"
