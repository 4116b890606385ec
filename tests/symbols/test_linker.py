"""DT_NEEDED resolution: the libraries the dynamic linker itself (ldd) loads, each object's dynamic
section read once per Linker (a long-running exporter sees many programs share libc)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from optrace.frontend.symbols import linker
from optrace.frontend.symbols.linker import DynamicInfo, Linker

PROGRAMS = ["/usr/bin/ls", "/usr/bin/python3.11", "/usr/bin/ssh", "/usr/bin/bash"]


def ldd_libraries(program: str) -> set[str]:
    """Real paths of what ``ldd`` lists (the vDSO has no file)."""
    output = subprocess.run(["ldd", program], check=True, capture_output=True, text=True).stdout
    paths = re.findall(r"(?:=> )?(/\S+) \(0x", output)
    return {os.path.realpath(path) for path in paths}


@pytest.mark.parametrize("program", [p for p in PROGRAMS if os.path.exists(p)])
def test_libraries_are_those_ldd_lists(program: str) -> None:
    found, problems = Linker().needed_libraries(program)
    assert problems == []
    assert {os.path.realpath(ref.read_path) for ref in found} == ldd_libraries(program)


def test_each_library_is_read_once_per_linker(monkeypatch) -> None:
    reads: list[str] = []
    original = linker.read_dynamic

    def counting(stream) -> DynamicInfo:
        reads.append(os.readlink(f"/proc/self/fd/{stream.fd}"))
        return original(stream)

    monkeypatch.setattr(linker, "read_dynamic", counting)
    shared = Linker()
    results = [shared.needed_libraries(program) for program in PROGRAMS if os.path.exists(program)]
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    assert reads.count(libc) == 1 and len(reads) == len(set(reads))
    assert results == [Linker().needed_libraries(p) for p in PROGRAMS if os.path.exists(p)]  # same answers


def test_objects_of_another_class_or_machine_are_skipped() -> None:
    with open("/usr/bin/ls", "rb") as stream:
        root = linker.read_dynamic(stream)
    header = bytearray(Path("/usr/bin/ls").read_bytes()[:64])
    assert linker._compatible(bytes(header[:20]), root)
    class32 = bytes(header[:4]) + b"\x01" + bytes(header[5:20])  # ELFCLASS32
    arm64 = bytes(header[:18]) + (183).to_bytes(2, "little")  # EM_AARCH64
    assert not any(linker._compatible(h, root) for h in (class32, arm64, b"not an ELF file\n", b""))


def test_origin_of_a_program_run_through_a_symlink_is_its_real_directory(tmp_path: Path) -> None:
    """As ld.so: /usr/bin/java -> /usr/lib/jvm/.../bin/java finds libjli.so through $ORIGIN/../lib."""
    app = tmp_path / "app"
    (app / "lib").mkdir(parents=True)
    (app / "bin").mkdir()
    (tmp_path / "l.c").write_text("int helper(void) { return 1; }\n")
    (tmp_path / "m.c").write_text("int helper(void); int main(void) { return helper(); }\n")
    library = app / "lib" / "libhelper.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libhelper.so", "-o", str(library), str(tmp_path / "l.c")],
                   check=True)
    subprocess.run(["gcc", "-o", str(app / "bin" / "prog"), str(tmp_path / "m.c"), str(library),
                    "-Wl,-rpath,$ORIGIN/../lib", "-Wl,--enable-new-dtags"], check=True)
    (tmp_path / "prog").symlink_to(app / "bin" / "prog")
    with open(app / "bin" / "prog", "rb") as stream:
        assert linker.read_dynamic(stream).needed[0] == "libhelper.so"
    found, problems = Linker().needed_libraries(str(tmp_path / "prog"))
    assert problems == [] and str(library) in {ref.read_path for ref in found}


@pytest.mark.skipif(not os.path.exists("/usr/bin/java"), reason="needs java")
def test_java_through_the_alternatives_links_finds_libjli() -> None:
    """/usr/bin/java -> /etc/alternatives/java -> /usr/lib/jvm/.../bin/java: RUNPATH $ORIGIN/../lib."""
    found, problems = Linker().needed_libraries("/usr/bin/java")
    assert problems == []
    assert any(ref.read_path.endswith("/lib/libjli.so") for ref in found), [r.read_path for r in found]


def test_origin_is_the_real_directory_only_of_the_file_that_was_opened(tmp_path: Path) -> None:
    """The bound on following the executable's symlinks: a link that now leads to another file (swapped
    after the open) gives the link's own directory, not the other file's."""
    from optrace.frontend.symbols.access import FileRef

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "prog").write_bytes(b"x")
    (tmp_path / "prog").symlink_to(tmp_path / "real" / "prog")
    info = os.stat(tmp_path / "real" / "prog")
    ref = FileRef(str(tmp_path / "prog"), str(tmp_path / "prog"), follow_symlinks=True)
    opened = linker._Object(ref, (info.st_dev, info.st_ino), linker.DynamicInfo(62, 64))
    assert linker._origin(opened, opened) == str(tmp_path / "real")
    swapped = linker._Object(ref, (info.st_dev, info.st_ino + 1), linker.DynamicInfo(62, 64))
    assert linker._origin(swapped, swapped) == str(tmp_path)
