"""ELF ground truth for the symbolization tests, taken from binutils (nm, readelf), not from the code
under test, and small programs built here with gcc."""
from __future__ import annotations

import re
import subprocess
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
