"""The tables walk a real stack end to end: a program built -O2 -fomit-frame-pointer whose known call chain
passes through libc's qsort (no frame pointers either) and its PLT is stopped at random moments; the
reference walker (walker.py, the contract's rules in Python) goes from the sampled pc to _start (the
return address undefined: complete) through every function of the chain, in order."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from walker import sample

from optrace.frontend.unwind.cache import UnwindTableCache

PROGRAM = Path(__file__).parent / "programs" / "chain.c"
# innermost first; glibc's qsort jumps to qsort_r (a tail call: no frame of its own)
CHAIN = ["spin", "inner", "middle", "compare", "qsort_r", "outer", "main"]
STOPS = 12


@pytest.fixture(scope="module")
def chain_binary(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("walk") / "chain"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-o", str(out),
                    str(PROGRAM)], check=True, capture_output=True)
    return out


def _functions(path: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of the file's function symbols (.symtab, else .dynsym)."""
    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        found = []
        for name in (".symtab", ".dynsym"):
            section = elf.get_section_by_name(name)
            if section is None:
                continue
            found += [(s["st_value"], s["st_value"] + max(s["st_size"], 1), s.name.split(".")[0])
                      for s in section.iter_symbols() if s["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC")]
        return found


def _name(frame, symbols: dict[str, list]) -> str:
    if frame.entry is None or frame.vaddr is None:
        return "?"
    path = frame.entry.file_path
    if path not in symbols:
        symbols[path] = _functions(path)
    table = symbols[path]
    return next((name for start, end, name in table if start <= frame.vaddr < end), "?")


def test_walk_reaches_start_through_libc(chain_binary: Path):
    proc = subprocess.Popen([str(chain_binary)], stdout=subprocess.PIPE)
    cache = UnwindTableCache()
    symbols: dict[str, list] = {}
    try:
        assert proc.stdout.readline() == b"ready\n"
        walks = []
        for _ in range(STOPS):
            time.sleep(0.02)
            frames, why = sample(proc.pid, cache)
            walks.append(([_name(frame, symbols) for frame in frames], why, [frame.how for frame in frames]))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    for names, why, how in walks:
        assert why == "complete" and set(how) == {"cfi"}, (names, why, how)
        assert names[-1] == "_start", names
        assert set(CHAIN) <= set(names), names
        positions = [names.index(function) for function in CHAIN]
        assert positions == sorted(positions), names
    assert cache.stats["conversions"] >= 2  # the program and libc, each once


CC1 = "/usr/lib/gcc/x86_64-linux-gnu/12/cc1"


@pytest.fixture(scope="module")
def c_source(tmp_path_factory) -> Path:
    """1,000 small functions with loops: a few seconds of cc1 -O2."""
    path = tmp_path_factory.mktemp("cc1") / "big.c"
    path.write_text("\n".join(f"int f{i}(int *a, int n) {{ int s = 0; for (int j = 0; j < n; j++) "
                              f"s += a[j] * {i} + (a[j] >> 3); return s; }}" for i in range(1000)))
    return path


@pytest.mark.parametrize("argv, expected", [
    (["/usr/bin/python3.11", "-c", "while True: pass"], ["_PyEval_EvalFrameDefault", "Py_RunMain"]),
    (["/usr/bin/xz", "-T1", "-6", "-c", CC1], ["lzma_code"]),
    pytest.param([CC1, "-quiet", "-O2", "SOURCE", "-o", "/dev/null"], ["_ZN6toplev4mainEiPPc"],
                 marks=pytest.mark.slow),  # cc1's 28,898 exported names through pyelftools
], ids=["python3.11", "xz", "cc1"])
def test_debian_programs_walk_to_their_root(argv: list[str], expected: list[str], c_source: Path):
    """Debian's python3.11, xz (liblzma) and gcc's cc1, unmodified, no frame pointers: every stop walks
    to the return address left undefined by _start's CFI, through the functions named; except, at most a
    quarter of the stops, in code that has no CFI at all (seen: cc1 in libgmp's __gmpn_copyi, assembly
    without an FDE, whose caller frame pointers cannot find)."""
    if not all(Path(arg).exists() for arg in argv if arg.startswith("/")):
        pytest.skip("not installed")
    argv = [str(c_source) if arg == "SOURCE" else arg for arg in argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    cache = UnwindTableCache()
    symbols: dict[str, list] = {}
    walks = []
    try:
        time.sleep(0.3)
        for _ in range(STOPS):
            time.sleep(0.02)
            frames, why = sample(proc.pid, cache)
            walks.append(([_name(frame, symbols) for frame in frames], why))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    complete = [names for names, why in walks if why == "complete"]
    assert all(why == "no cfi" for _, why in walks if why != "complete"), walks
    assert len(complete) >= STOPS - STOPS // 4, walks
    for names in complete:
        assert "__libc_start_main" in names[-3:], names  # then __libc_start_call_main, main (not exported)
    assert sum(all(name in names for name in expected) for names, _ in walks) >= STOPS // 2, walks
