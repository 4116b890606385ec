"""The CPython interpreters of this machine the Python-frame tests run against, and children started with them.

Besides pyenv's and Debian's (bookworm), Debian sid's python3.14 and python3.15 ("3.14-sid", "3.15-sid"): they
need sid's glibc, so they run from the sid root `make setup` makes, in their own mount namespace and root as a
container runs them (bench/sidroot.py), with the repository and /tmp bound in at the same paths (a test's files
are where the test put them, and their frames name them so).
"""
from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sidroot import SID_ROOT, in_container, sid_python

PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
PROGRAMS = Path(__file__).parent / "programs"
SID = ["3.14-sid", "3.15-sid"]
SUPPORTED = ["3.8", "3.9", "3.10", "3.11", "3.11-debian", "3.12", "3.13", *SID]
REFUSED = ["3.6", "3.7"]
DEBIAN_311 = Path("/usr/bin/python3.11")
REPO = Path(__file__).resolve().parents[2]
BINDS = [REPO, Path("/tmp")]  # bound into sid's container at their own paths


def interpreter(name: str) -> Path | None:
    """The executable of "3.X" (pyenv's newest 3.X.Y), "3.11-debian" or "3.1X-sid" (the file in the sid root);
    None when not installed."""
    if name == "3.11-debian":
        return DEBIAN_311 if DEBIAN_311.exists() else None
    if name in SID:
        exe = sid_python(minor_name(name))
        return exe if exe.exists() else None
    found = sorted(PYENV_VERSIONS.glob(f"{name}.*/bin/python{name}"), key=lambda p: p.parts[-3])
    return found[-1] if found else None


def minor_name(name: str) -> str:
    """"3.14" of "3.14-sid"."""
    return name.split("-")[0]


def command(name: str) -> list[str]:
    """The argv that runs interpreter ``name`` (skips the test when it is not installed): its executable, or
    for sid's, a container around it (the same pid: unshare and chroot exec into it)."""
    exe = require(name)
    return [str(exe)] if name not in SID else in_container([f"/usr/bin/{exe.name}"], BINDS)


def include_dir(name: str) -> Path | None:
    """The folder holding Python.h of that interpreter (internal headers included), None when absent."""
    exe = interpreter(name)
    if exe is None:
        return None
    minor = minor_name(name)
    if name.endswith("debian"):
        folder = Path(f"/usr/include/python{minor}")
    elif name in SID:
        folder = SID_ROOT / "usr" / "include" / f"python{minor}"
    else:
        folder = exe.parent.parent / "include" / f"python{minor}"
    return folder if (folder / "internal").is_dir() else None


def require(name: str) -> Path:
    exe = interpreter(name)
    if exe is None:
        pytest.skip(f"python {name} is not installed")
    return exe


@contextmanager
def child(argv: list[str], lines: int = 0) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """A process for the block (killed after), with the first ``lines`` lines it printed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        got = [proc.stdout.readline().strip() for _ in range(lines)]
        if any(not line for line in got):
            raise AssertionError(f"{argv} exited before printing {lines} lines: {got}")
        yield proc, got
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def build_fake_python(folder: Path, name: str = "python3.11", version_hex: int = 0x030B02F0,
                      debug_offsets: bytes | None = None) -> Path:
    """programs/fakepython.c built as ``folder/name``, with Py_Version ``version_hex`` and the 3.11 table's
    offsets, or those ``debug_offsets`` (a _Py_DebugOffsets, 3.13+) say, put at the start of _PyRuntime."""
    from optrace.frontend.runtimes.cpython.debugoffsets import parse_debug_offsets
    from optrace.frontend.runtimes.cpython.layouts import table_layout, table_thread_offsets

    if debug_offsets is None:
        layout, threads = table_layout((3, 11)), table_thread_offsets((3, 11))
    else:
        parsed = parse_debug_offsets(debug_offsets)
        assert not isinstance(parsed, str), parsed
        layout, threads = parsed.layout, parsed.threads
    defines = {"INTERPRETERS_HEAD": layout.interpreters_head, "INTERP_THREADS_HEAD": layout.interp_threads_head,
               "TSTATE_INTERP": threads.tstate_interp, "TSTATE_NEXT": layout.tstate_next,
               "TSTATE_THREAD_ID": layout.tstate_thread_id,
               "TSTATE_NATIVE_THREAD_ID": threads.tstate_native_thread_id, "TSTATE_FRAME": layout.tstate_frame,
               "CFRAME_CURRENT_FRAME": layout.cframe_current_frame, "FRAME_PREVIOUS": layout.frame_previous,
               "FRAME_CODE": layout.frame_code, "FRAME_INSTR": layout.frame_instr,
               "CODE_ADAPTIVE": layout.code_adaptive,
               "CODE_NAME": layout.code_name, "CODE_QUALNAME": layout.code_qualname,
               "CODE_FILENAME": layout.code_filename, "CODE_LINETABLE": layout.code_linetable,
               "UNICODE_LENGTH": layout.unicode_length, "UNICODE_STATE": layout.unicode_state,
               "UNICODE_ASCII_DATA": layout.unicode_ascii_data, "BYTES_SIZE": layout.bytes_size,
               "BYTES_DATA": layout.bytes_data,
               "PY_VERSION_HEX": version_hex,
               **({"RUNTIME_PREFIX": ",".join(map(str, debug_offsets))} if debug_offsets else {})}
    out = folder / name
    subprocess.run(["gcc", "-O0", "-rdynamic", "-pthread", *(f"-D{key}={value}" for key, value in defines.items()),
                    "-o", str(out), str(PROGRAMS / "fakepython.c")], check=True, capture_output=True)
    return out


# _Py_DebugOffsets of 3.13 at the byte positions of the v3.13.0 header, written out by hand (position -> value)
POSITIONS_313 = {24: 300000, 40: 632, 48: 9000, 72: 3000, 152: 500, 168: 8, 176: 16, 184: 72, 192: 152, 200: 160,
                 224: 80, 232: 8, 240: 0, 248: 56, 264: 70, 272: 208, 280: 112, 288: 120, 296: 128, 304: 136,
                 312: 68, 344: 200, 352: 16, 360: 8, 512: 40, 520: 16, 528: 32, 536: 56, 544: 32, 552: 16, 560: 40}


def synthesized(positions: dict[int, int], version_hex: int, size: int, free_threaded: int = 0,
                cookie: bytes = b"xdebugpy", cut: int | None = None) -> bytes:
    data = bytearray(struct.pack("<8sQQ", cookie, version_hex, free_threaded) + bytes(size - 24))
    for at in range(24, size, 8):
        struct.pack_into("<Q", data, at, 7)  # a small value in every field the walker does not use
    for at, value in positions.items():
        struct.pack_into("<Q", data, at, value)
    return bytes(data[:cut])
