"""ELF ground truth for the symbolization tests, taken from binutils (nm, readelf), not from the code
under test, and small programs built here with gcc."""
from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = r"""
#include <stdlib.h>
volatile unsigned sink;
__attribute__((noinline)) void alpha(int n) { for (int i = 0; i < n; i++) sink += i * 3; }
__attribute__((noinline)) static void beta(int n) { for (int i = 0; i < n; i++) sink ^= i; }
__attribute__((noinline)) void gamma_fn(int n) { for (int i = 0; i < n; i++) sink += i; beta(n); }
int main(int argc, char **argv) { alpha(argc); gamma_fn(argc); return 0; }
"""
FDE_LINE = re.compile(r"^\S+ \S+ \S+ FDE cie=\S+ pc=([0-9a-f]+)\.\.([0-9a-f]+)$")


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


class ElfFacts:
    """What binutils says about an ELF file."""

    @staticmethod
    def symbol(path: Path | str, name: str, dynamic: bool = False) -> tuple[int, int]:
        """(virtual address, size) of ``name`` from ``nm -S``."""
        output = run("nm", "-S", *(["-D"] if dynamic else []), str(path))
        for line in output.splitlines():
            fields = line.split()
            if len(fields) == 4 and fields[3].split("@")[0] == name:
                return int(fields[0], 16), int(fields[1], 16)
        raise AssertionError(f"{name} not in nm output of {path}")

    @staticmethod
    def file_offset(path: Path | str, vaddr: int) -> int:
        """The file offset of ``vaddr`` from the PT_LOAD lines of ``readelf -lW``."""
        for line in run("readelf", "-lW", str(path)).splitlines():
            fields = line.split()
            if fields[:1] == ["LOAD"]:
                offset, start, filesz = int(fields[1], 16), int(fields[2], 16), int(fields[4], 16)
                if start <= vaddr < start + filesz:
                    return vaddr - start + offset
        raise AssertionError(f"{vaddr:#x} is in no PT_LOAD of {path}")

    @classmethod
    def offset_of(cls, path: Path | str, name: str, plus: int = 0) -> int:
        return cls.file_offset(path, cls.symbol(path, name)[0] + plus)

    @staticmethod
    def fdes(path: Path | str) -> list[tuple[int, int]]:
        """The [start, end) ranges of the FDEs ``readelf --debug-dump=frames`` decodes, sorted."""
        text = run("readelf", "--debug-dump=frames", str(path))
        found = [FDE_LINE.match(line) for line in text.splitlines()]
        return sorted((int(m.group(1), 16), int(m.group(2), 16)) for m in found if m and m.group(1) != m.group(2))

    @staticmethod
    def build_id(path: Path | str) -> bytes:
        match = re.search(r"Build ID: ([0-9a-f]+)", run("readelf", "-n", str(path)))
        assert match, f"{path} has no build-id"
        return bytes.fromhex(match.group(1))


    @staticmethod
    def compile(directory: Path, name: str = "prog", extra: tuple[str, ...] = ()) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        source = directory / f"{name}.c"
        source.write_text(PROGRAM)
        binary = directory / name
        run("gcc", "-O1", "-g", "-Wl,--build-id", *extra, "-o", str(binary), str(source))
        return binary


    @staticmethod
    def split_debug(binary: Path, debug_file: Path) -> None:
        """Debian/Fedora style: the debug info moved to ``debug_file``, the binary stripped."""
        debug_file.parent.mkdir(parents=True, exist_ok=True)
        run("objcopy", "--only-keep-debug", str(binary), str(debug_file))
        run("strip", "--strip-all", str(binary))

    @staticmethod
    def add_mini_debuginfo(binary: Path) -> None:
        """The recipe of gdb's manual ("MiniDebugInfo"), as Fedora's find-debuginfo runs it."""
        work = binary.parent
        posix = ("--format=posix", "--defined-only")
        dynamic = {line.split()[0] for line in run("nm", "-D", *posix, str(binary)).splitlines()}
        functions = [line.split()[0] for line in run("nm", *posix, str(binary)).splitlines()
                     if line.split()[1] in ("T", "t")]
        (work / "keep_symbols").write_text("".join(f"{name}\n" for name in functions if name not in dynamic))
        run("objcopy", "--only-keep-debug", str(binary), str(work / "debug"))
        run("objcopy", "-S", "--remove-section", ".gdb_index", "--remove-section", ".comment",
            f"--keep-symbols={work / 'keep_symbols'}", str(work / "debug"), str(work / "mini_debuginfo"))
        run("strip", "--strip-all", "-R", ".comment", str(binary))
        run("xz", "-f", str(work / "mini_debuginfo"))
        run("objcopy", f"--add-section=.gnu_debugdata={work / 'mini_debuginfo.xz'}", str(binary))


@pytest.fixture(scope="session")
def elf() -> type[ElfFacts]:
    return ElfFacts


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """A fresh small C program with the functions alpha, beta (static), gamma_fn and main."""
    return ElfFacts.compile(tmp_path / "prog")


SYMBOLIZE_SCRIPT = r"""
import json, sys, time
from optrace.model import RawSample, UserFrame
from optrace.frontend.symbols import Symbolizer


def peak_rss_mb():  # VmHWM: this image's own peak (ru_maxrss keeps the forking parent's across exec)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


args = json.loads(sys.argv[1])
started = time.monotonic()
symbolizer = Symbolizer(debug_roots=tuple(args["roots"]))
symbolizer.machine.scan_standard_dirs(())
for path in args["executables"]:
    symbolizer.add_executable(path)
for pid in args["pids"]:
    symbolizer.snapshot_process(pid)
raw = [RawSample(pid, "t", (UserFrame(bytes.fromhex(build_id) if build_id else None, offset),), (), 1)
       for build_id, offset, pid in args["frames"]]
frames, samples = symbolizer.symbolize(raw)
named = [frames[sample.frames[0]] for sample in samples]
print(json.dumps({"frames": [[f.symbol, f.dso, f.resolved] for f in named], "warnings": symbolizer.warnings,
                  "stats": symbolizer.stats, "seconds": time.monotonic() - started, "cpu_seconds": time.process_time(),
                  "maxrss_mb": peak_rss_mb()}))
"""

SHDR64 = {"sh_name": (0, "I"), "sh_type": (4, "I"), "sh_flags": (8, "Q"), "sh_offset": (24, "Q"),
          "sh_size": (32, "Q"), "sh_link": (40, "I"), "sh_info": (44, "I"), "sh_entsize": (56, "Q")}


class Hostile:
    """Hostile ELF files built from real ones with binutils and byte patches, and a symbolizer run in a
    child process (a hang is a timeout there, and its peak RSS is measured)."""

    @staticmethod
    def symbolize(executables=(), frames=(), pids=(), roots=(), timeout: float = 60) -> dict:
        """Run a Symbolizer in a child; ``frames`` are (build-id hex or None, offset, pid). A child
        blocked in an open or a read fails the test by ``timeout`` (generous: the machine may be
        busy; what the work costs is asserted on ``cpu_seconds``)."""
        args = {"executables": [str(p) for p in executables], "frames": [list(f) for f in frames],
                "pids": list(pids), "roots": [str(r) for r in roots]}
        result = subprocess.run([sys.executable, "-c", SYMBOLIZE_SCRIPT, json.dumps(args)], capture_output=True,
                                text=True, timeout=timeout)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    @staticmethod
    def section_index(path: Path, name: str) -> int:
        for line in run("readelf", "-SW", str(path)).splitlines():
            match = re.match(r"\s*\[\s*(\d+)\]\s+(\S+)", line)
            if match and match.group(2) == name:
                return int(match.group(1))
        raise AssertionError(f"{name} not in readelf -S of {path}")

    @staticmethod
    def section_offset(path: Path, name: str) -> tuple[int, int]:
        """(file offset, size) of a section, from readelf."""
        for line in run("readelf", "-SW", str(path)).splitlines():
            fields = re.sub(r"\[\s*", "[", line).split()
            if len(fields) > 5 and fields[1] == name:
                return int(fields[4], 16), int(fields[5], 16)
        raise AssertionError(f"{name} not in readelf -S of {path}")

    @classmethod
    def patch_section(cls, path: Path, name: str, **fields: int) -> None:
        """Overwrite fields (sh_link=..., sh_flags=...) of a 64-bit little-endian section header."""
        data = bytearray(path.read_bytes())
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        (shentsize,) = struct.unpack_from("<H", data, 0x3A)
        at = shoff + cls.section_index(path, name) * shentsize
        for field, value in fields.items():
            offset, kind = SHDR64[field]
            struct.pack_into("<" + kind, data, at + offset, value)
        path.write_bytes(data)

    @staticmethod
    def add_section(path: Path, name: str, content: bytes) -> None:
        blob = path.parent / f"{path.name}.{name.strip('.')}.bin"
        blob.write_bytes(content)
        run("objcopy", f"--add-section={name}={blob}", str(path))

    @staticmethod
    def debuglink(name: bytes, crc: int = 0) -> bytes:
        """A .gnu_debuglink section: the name, NUL, padding to 4 bytes, the CRC-32."""
        body = name + b"\0"
        return body + b"\0" * (-len(body) % 4) + struct.pack("<I", crc)


@pytest.fixture(scope="session")
def hostile() -> type[Hostile]:
    return Hostile
