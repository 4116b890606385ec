"""bpf/programcache.py: a program is compiled once per kernel and program, then loaded stored (no compiler,
no bcc imported); an entry that is not exactly what was stored for this program and kernel (a flipped
byte, a truncated file, another program's entry, one left by another kernel release) is never loaded:
the program is compiled again and the entry replaced. Real BPF, each test with a cache of its own."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from optrace.bpf import programcache
from optrace.bpf.loader import ProgramLoad, program_loads
from support import REPO

pytestmark = pytest.mark.usefixtures("bpf_ready")


def load(kind: str) -> ProgramLoad:
    """Load one of optrace's programs (the sampler without its walker, nothing attached; or the uprobes'
    program, a function used), close it."""
    if kind == "profile":
        from optrace.bpf.profiler import Profiler

        profiler = Profiler(99, pids=[], stack_storage_size=1024)
        profiler.load()
        profiler.close()
    else:
        from optrace.bpf.uprobes import BpfUprobeAttacher

        BpfUprobeAttacher(multi=False).close()
    return program_loads()[-1]


def entries(cache: Path) -> list[Path]:
    return sorted(path for path in (cache / "programs").iterdir() if not path.name.startswith(".new-"))


def test_a_program_is_compiled_once_then_loaded_stored(fresh_program_cache):
    first, second = load("profile"), load("profile")
    assert (first.compiled, second.compiled) == (True, False)
    assert first.sources == ("stackstore.c", "profile.c", "forks.c")
    stored = entries(fresh_program_cache)
    assert len(stored) == 1
    assert stat.S_IMODE(stored[0].stat().st_mode) == 0o600
    assert stat.S_IMODE((fresh_program_cache / "programs").stat().st_mode) == 0o700


def test_each_program_and_option_has_its_own_entry(fresh_program_cache):
    from optrace.bpf.profiler import Profiler

    assert load("profile").compiled and load("uprobes").compiled
    profiler = Profiler(99, pids=[], stack_storage_size=2048)  # another size: another program
    profiler.load()
    profiler.close()
    assert program_loads()[-1].compiled
    assert len(entries(fresh_program_cache)) == 3


def header(entry: Path) -> dict:
    data = entry.read_bytes()[len(programcache.MAGIC):]
    return json.loads(data[4:4 + int.from_bytes(data[:4], "little")])


def flip_byte(entry: Path, at: int) -> None:
    data = bytearray(entry.read_bytes())
    data[at] ^= 0x40
    entry.write_bytes(bytes(data))


def flipped_in_the_instructions(entry: Path) -> None:
    flip_byte(entry, len(entry.read_bytes()) - 5)


def flipped_in_the_description(entry: Path) -> None:
    data = entry.read_bytes()
    flip_byte(entry, data.index(b'"max_entries": ') + len(b'"max_entries": '))


def flipped_in_the_key(entry: Path) -> None:
    data = entry.read_bytes()
    flip_byte(entry, data.index(b'"key": "') + len(b'"key": "'))


def truncated(entry: Path) -> None:
    entry.write_bytes(entry.read_bytes()[:len(entry.read_bytes()) // 2])


@pytest.mark.parametrize("tamper", [flipped_in_the_instructions, flipped_in_the_description, flipped_in_the_key,
                                    truncated])
def test_a_damaged_entry_is_compiled_again_and_replaced(fresh_program_cache, tamper):
    assert load("profile").compiled
    (entry,) = entries(fresh_program_cache)
    tamper(entry)
    assert load("profile").compiled, "the damaged entry was loaded"
    assert not load("profile").compiled  # the good entry written in its place
    assert entries(fresh_program_cache) == [entry]


def test_another_programs_entry_is_not_loaded(fresh_program_cache):
    """An entry copied under another program's name (its checksum is right: it is a good entry, of the
    wrong program) is refused by the key its header holds."""
    assert load("profile").compiled
    (profile,) = entries(fresh_program_cache)
    assert load("uprobes").compiled
    (uprobes,) = set(entries(fresh_program_cache)) - {profile}
    uprobes.write_bytes(profile.read_bytes())
    assert load("uprobes").compiled, "the sampler's program was loaded for the uprobes"
    assert not load("uprobes").compiled


def test_an_entry_of_another_kernel_release_is_not_loaded(fresh_program_cache, monkeypatch):
    """Stored while the kernel said another release: a miss under this kernel, which compiles its own."""
    real = programcache.kernel_identity()
    monkeypatch.setattr(programcache, "kernel_identity", lambda: {**real, "release": "6.1.0-fake-amd64"})
    assert load("profile").compiled
    (stored_elsewhere,) = entries(fresh_program_cache)
    monkeypatch.setattr(programcache, "kernel_identity", lambda: real)
    assert load("profile").compiled, "the other release's program was loaded"
    assert len(entries(fresh_program_cache)) == 2
    assert header(stored_elsewhere)["kernel"]["release"] == "6.1.0-fake-amd64"  # left for LRU to trim
    assert not load("profile").compiled


def test_a_stored_program_loads_without_bcc(fresh_program_cache):
    """The warm path imports no bcc and maps no LLVM (libbcc.so maps clang and LLVM when loaded)."""
    load("profile")
    script = (
        "import sys\n"
        "from optrace.bpf.profiler import Profiler\n"
        "from optrace.bpf.loader import program_loads\n"
        "profiler = Profiler(99, pids=[], stack_storage_size=1024)\n"
        "profiler.load(); profiler.close()\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(program_loads()[-1].compiled, 'bcc' in sys.modules, 'libLLVM' in maps or 'libbcc.so' in maps)\n"
    )
    env = {**os.environ, "OPTRACE_CACHE_DIR": str(fresh_program_cache)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120)
    assert out.stdout.split() == ["False", "False", "False"], out.stderr
