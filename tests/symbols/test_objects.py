"""Build-id frames (what BPF_STACK_TRACE_BUILDID returns) named from ELF files, ground truth from nm."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from optrace.model import UNKNOWN, Frame, RawSample, UserFrame
from optrace.frontend.symbols import Symbolizer

NO_DEBUG_ROOTS: tuple[str, ...] = ()


def symbolize_one(symbolizer: Symbolizer, build_id: bytes, offset: int) -> Frame:
    frames, samples = symbolizer.symbolize([RawSample(1, "t", (UserFrame(build_id, offset),), (), 1)])
    return frames[samples[0].frames[0]]


def test_pie_executable_offset_names_function(workloads: Path, elf) -> None:
    demo = workloads / "demo"
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(demo))
    offset = elf.offset_of(demo, "hot_a", plus=17)
    frame = symbolize_one(symbolizer, elf.build_id(demo), offset)
    assert frame == Frame("hot_a", str(demo), address=offset, build_id=elf.build_id(demo).hex())


def test_non_pie_executable_offset_names_function(workloads: Path, elf) -> None:
    demo = workloads / "demo-nopie"
    vaddr, size = elf.symbol(demo, "hot_b")
    assert vaddr >= 0x400000  # really linked at a fixed address: offset and address differ
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(demo))
    build_id = elf.build_id(demo)
    assert symbolize_one(symbolizer, build_id, elf.file_offset(demo, vaddr + size - 1)).symbol == "hot_b"
    assert symbolize_one(symbolizer, build_id, elf.file_offset(demo, vaddr)).symbol == "hot_b"


def test_shared_library_found_through_runpath_origin(workloads: Path, elf) -> None:
    """add_executable indexes DT_NEEDED libraries: libburn.so via DT_RUNPATH $ORIGIN, libc via ld.so.cache."""
    library = workloads / "libburn.so"
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(workloads / "demo"))
    frame = symbolize_one(symbolizer, elf.build_id(library), elf.offset_of(library, "lib_burn", plus=3))
    assert (frame.symbol, frame.dso, frame.resolved) == ("lib_burn", str(library), True)
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    assert symbolizer.machine.by_build_id[elf.build_id(libc)].name.endswith("libc.so.6")
    assert symbolizer.stats.get("scanned_files") is None  # everything came from the index


def test_cplusplus_method_is_demangled(workloads: Path, elf) -> None:
    demo = workloads / "demo"
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(demo))
    frame = symbolize_one(symbolizer, elf.build_id(demo), elf.offset_of(demo, "_ZN4demo6Hasher3mixEd", plus=8))
    assert frame.symbol == "demo::Hasher::mix(double)"


def test_address_outside_all_symbols_shows_dso_plus_offset(workloads: Path, elf) -> None:
    library = workloads / "libburn.so"
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(library))
    frame = symbolize_one(symbolizer, elf.build_id(library), 0x40)  # the program headers, no function
    assert (frame.symbol, frame.dso, frame.resolved) == ("libburn.so+0x40", str(library), False)


def test_unknown_build_id_is_unknown_with_its_hex(tmp_path: Path) -> None:
    symbolizer = Symbolizer(debug_roots=(str(tmp_path),))
    build_id = bytes(range(20))
    frame = symbolize_one(symbolizer, build_id, 0x1234)
    assert frame == Frame(UNKNOWN, UNKNOWN, address=0x1234, resolved=False, build_id=build_id.hex())
    assert symbolizer.stats["scanned_files"] > 10  # the fallback scan ran (once)
    symbolize_one(symbolizer, build_id, 0x1235)
    assert symbolizer.stats["frames_unresolved"] == 2


def test_library_found_by_directory_scan(elf) -> None:
    """Nothing indexed: libc is still found by the one-time scan of the standard library dirs."""
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    offset = elf.file_offset(libc, elf.symbol(libc, "getpid", dynamic=True)[0])
    frame = symbolize_one(symbolizer, elf.build_id(libc), offset)
    assert frame.symbol in ("getpid", "__getpid") and frame.dso.endswith("libc.so.6")


def test_program_dirs_are_scanned_too(elf) -> None:
    """A process that ran before the recording and was never snapshotted: /usr/bin is scanned."""
    sleep = Path("/usr/bin/sleep")
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    assert symbolize_one(symbolizer, elf.build_id(sleep), 0x40).dso == str(sleep)


def test_symbol_versions_are_not_part_of_the_name(tmp_path: Path, elf) -> None:
    """glibc-style versioned definitions: .symtab holds "api@VERS_1"; frames show "api"."""
    (tmp_path / "v.c").write_text('int api_v1(void) { return 1; }\n__asm__(".symver api_v1,api@VERS_1");\n'
                                  "int api_v2(void) { return 2; }\n__asm__(\".symver api_v2,api@@VERS_2\");\n")
    (tmp_path / "v.map").write_text("VERS_1 { global: api; local: *; };\nVERS_2 { global: api; } VERS_1;\n")
    library = tmp_path / "libv.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,--build-id", f"-Wl,--version-script={tmp_path / 'v.map'}",
                    "-o", str(library), str(tmp_path / "v.c")], check=True)
    symtab = subprocess.run(["nm", str(library)], capture_output=True, text=True, check=True).stdout
    assert "api@VERS_1" in symtab and "api@@VERS_2" in symtab
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(library))
    names = {symbolize_one(symbolizer, elf.build_id(library), elf.offset_of(library, local)).symbol
             for local in ("api_v1", "api_v2")}  # each shares its address with a versioned global "api"
    assert names == {"api"}


def test_stripped_binary_named_through_build_id_debug_file(tmp_path: Path, program: Path, elf) -> None:
    offset = elf.offset_of(program, "gamma_fn", plus=2)
    build_id = elf.build_id(program)
    root = tmp_path / "debug"
    elf.split_debug(program, root / ".build-id" / build_id.hex()[:2] / f"{build_id.hex()[2:]}.debug")
    symbolizer = Symbolizer(debug_roots=(str(root),))
    symbolizer.add_executable(str(program))
    frame = symbolize_one(symbolizer, build_id, offset)
    assert (frame.symbol, frame.dso) == ("gamma_fn", str(program))
    without_debug = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    without_debug.add_executable(str(program))
    assert symbolize_one(without_debug, build_id, offset).symbol == f"prog+{offset - 2:#x}"  # its FDE's start
    program.unlink()  # binary gone, Debian-style debug file (no path to guess from): named by build-id
    frame = symbolize_one(Symbolizer(debug_roots=(str(root),)), build_id, offset)
    assert (frame.symbol, frame.dso) == ("gamma_fn", f"[build-id {build_id.hex()[:12]}]")


def test_debug_file_alone_names_frames_of_a_missing_binary(tmp_path: Path, program: Path, elf) -> None:
    """The binary is gone; the debug file's program headers give the layout (offsets rebuilt)."""
    offsets = {name: elf.offset_of(program, name, plus=1) for name in ("alpha", "beta", "gamma_fn", "main")}
    build_id = elf.build_id(program)
    root = tmp_path / "debug"
    elf.split_debug(program, root / "opt" / "prog.debug")
    link = root / ".build-id" / build_id.hex()[:2] / f"{build_id.hex()[2:]}.debug"
    link.parent.mkdir(parents=True)
    link.symlink_to(root / "opt" / "prog.debug")
    program.unlink()
    symbolizer = Symbolizer(debug_roots=(str(root),))
    for name, offset in offsets.items():
        frame = symbolize_one(symbolizer, build_id, offset)
        assert (frame.symbol, frame.dso) == (name, "/opt/prog")


def test_debuglink_in_same_dir_and_dot_debug_with_crc_check(tmp_path: Path, program: Path, elf) -> None:
    offset = elf.offset_of(program, "alpha")
    build_id = elf.build_id(program)
    debug = program.parent / ".debug" / "prog.dbg"
    elf.split_debug(program, debug)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(program)], check=True)
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(program))
    assert symbolize_one(symbolizer, build_id, offset).symbol == "alpha"

    debug.write_bytes(debug.read_bytes() + b"\0")  # CRC no longer matches: must not be used
    stale = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    stale.add_executable(str(program))
    assert symbolize_one(stale, build_id, offset).symbol == f"prog+{offset:#x}"  # by its FDE alone


def test_debuglink_under_debug_root(tmp_path: Path, program: Path, elf) -> None:
    offset = elf.offset_of(program, "beta")
    build_id = elf.build_id(program)
    root = tmp_path / "root"
    debug = root / str(program.parent).lstrip("/") / "prog.debug"
    elf.split_debug(program, debug)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(program)], check=True)
    symbolizer = Symbolizer(debug_roots=(str(root),))
    symbolizer.add_executable(str(program))
    assert symbolize_one(symbolizer, build_id, offset).symbol == "beta"


def test_mini_debuginfo_names_static_function(program: Path, elf) -> None:
    offsets = {name: elf.offset_of(program, name, plus=1) for name in ("alpha", "beta")}
    build_id = elf.build_id(program)
    elf.add_mini_debuginfo(program)
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(program))
    assert symbolize_one(symbolizer, build_id, offsets["beta"]).symbol == "beta"
    assert symbolize_one(symbolizer, build_id, offsets["alpha"]).symbol == "alpha"  # not in .dynsym either


def test_symbol_table_loaded_once_for_many_frames(workloads: Path, elf) -> None:
    demo, library = workloads / "demo", workloads / "libburn.so"
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(demo))
    demo_id, library_id = elf.build_id(demo), elf.build_id(library)
    start, size = elf.symbol(demo, "hot_a")
    lib_offset, demo_offset = elf.offset_of(library, "lib_burn"), elf.file_offset(demo, start)
    samples = [RawSample(pid, "demo", (UserFrame(library_id, lib_offset + i % 64),
                                       UserFrame(demo_id, demo_offset + i % size)), (), 1)
               for pid in range(2) for i in range(50_000)]
    for _ in range(2):
        frames, rows = symbolizer.symbolize(samples)
        assert {frames[index].symbol for row in rows for index in row.frames} == {"hot_a", "lib_burn"}
    assert symbolizer.stats["dsos_loaded"] == 2
    assert symbolizer.stats["frames_resolved"] == 2 * 2 * 100_000
    assert len(frames) == 64 + size


def test_binary_replaced_after_indexing_is_not_misnamed(tmp_path: Path, program: Path, elf) -> None:
    offset = elf.offset_of(program, "alpha")
    build_id = elf.build_id(program)
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(program))
    other = elf.compile(tmp_path / "other", extra=("-DOTHER=1", "-O0"))
    shutil.copy(other, program)
    frame = symbolize_one(symbolizer, build_id, offset)
    assert frame.symbol == f"prog+{offset:#x}" and not frame.resolved
    assert any("changed since it was seen" in line for line in symbolizer.warnings)


def test_add_executable_skips_scripts_and_reports_missing_libraries(tmp_path: Path, elf) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    library_dir = tmp_path / "lib"
    library_dir.mkdir()
    (library_dir / "gone.c").write_text("int gone(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library_dir / "libgone.so"), str(library_dir / "gone.c")],
                   check=True)
    program = tmp_path / "uses_gone"
    (tmp_path / "main.c").write_text("int gone(void); int main(void) { return gone(); }\n")
    subprocess.run(["gcc", "-o", str(program), str(tmp_path / "main.c"), f"-L{library_dir}", "-lgone",
                    "-Wl,--build-id", "-Wl,--no-as-needed"], check=True)
    (library_dir / "libgone.so").unlink()
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS)
    symbolizer.add_executable(str(script))
    assert symbolizer.warnings == []
    symbolizer.add_executable(str(program))
    symbolizer.add_executable(str(program))  # unchanged file: not read again, not warned twice
    assert symbolizer.warnings == [f"libgone.so (needed by {program}) not found"]
    assert elf.build_id(program) in symbolizer.machine.by_build_id


def test_the_library_scan_goes_in_slices_for_a_daemon(elf) -> None:
    """serve and top scan the library dirs for an unknown build-id a slice per drain (2,500 files held a
    drain ~10 s on a slow machine): each call returns within about its slice, and the library is found
    once the scan reaches it."""
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    offset = elf.file_offset(libc, elf.symbol(libc, "getpid", dynamic=True)[0])
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS, scan_slice_s=0.0)  # one file per call
    calls = 0
    while True:
        calls += 1
        frame = symbolize_one(symbolizer, elf.build_id(libc), offset)
        if frame.dso.endswith("libc.so.6") or symbolizer.machine.scan_complete:
            break
    assert frame.symbol in ("getpid", "__getpid") and calls > 10, (calls, frame)
    assert symbolizer.stats["scanned_files"] == calls


def test_one_symbolize_call_takes_one_slice_of_the_scan_however_many_frames_miss(elf) -> None:
    """Every frame of an unknown build-id misses: a slice per frame would be the whole scan again."""
    symbolizer = Symbolizer(debug_roots=NO_DEBUG_ROOTS, scan_slice_s=0.0)
    unknown = bytes(range(20))
    symbolizer.symbolize([RawSample(1, "x", (UserFrame(unknown, 0x100 + i),), (), 1) for i in range(50)])
    assert symbolizer.stats["scanned_files"] == 1 and not symbolizer.machine.scan_complete
