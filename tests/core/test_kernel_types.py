"""bpf/kernel_types.h: the programs are compiled against optrace's own declarations of the few kernel types
they use, not the kernel headers (the headers were most of the compile, before the first sample). The
declarations are checked against the running kernel's BTF; the headers remain the path where BTF is missing."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from optrace.bpf import bcccompile, loader
from optrace.bpf import btf as btf_module
from optrace.bpf.btf import VMLINUX, BtfTypes

PT_REGS = ("r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax", "cx", "dx", "si", "di",
           "orig_ax", "ip", "cs", "flags", "sp", "ss")
LAYOUTS = """
BPF_ARRAY(regs_layout, struct pt_regs, 1);
BPF_ARRAY(perf_layout, struct bpf_perf_event_data, 1);
int nothing(void *ctx) { return TASK_COMM_LEN; }
"""


@pytest.fixture
def layouts(bpf_ready, tmp_path: Path):
    source = tmp_path / "layouts.c"
    source.write_text(LAYOUTS)
    program = loader.load_bcc([source], kernel_headers=False)
    yield program
    program.cleanup()


def btf() -> BtfTypes:
    return BtfTypes(Path(VMLINUX).read_bytes())


def test_this_machine_compiles_against_the_own_types():
    assert loader.own_types_apply()


def test_pt_regs_is_the_running_kernels(layouts):
    regs = layouts[b"regs_layout"].Leaf
    types = btf()
    for field in PT_REGS:
        assert getattr(regs, field).offset == types.member_offset("pt_regs", field), field
    assert ctypes.sizeof(regs) == types.member_offset("bpf_perf_event_data", "sample_period")


def test_the_perf_event_context_is_the_running_kernels(layouts):
    data = layouts[b"perf_layout"].Leaf
    types = btf()
    for field in ("regs", "sample_period", "addr"):
        assert getattr(data, field).offset == types.member_offset("bpf_perf_event_data", field), field


class CompileSpy:
    """The cflags of every compile (run with an empty program cache: each load compiles)."""

    def __init__(self, monkeypatch) -> None:
        self.cflags: list[list[str]] = []
        compile_program = bcccompile.compile_program

        def spied(text: bytes, cflags):
            self.cflags.append(list(cflags))
            return compile_program(text, cflags)

        monkeypatch.setattr(bcccompile, "compile_program", spied)


def test_the_profiler_compiles_without_the_kernel_headers(bpf_ready, monkeypatch, fresh_program_cache):
    spy = CompileSpy(monkeypatch)
    header_built("profiler").close()
    assert len(spy.cflags) == 1 and "-DKERNEL_HEADERS" not in spy.cflags[0]


def test_unreadable_btf_compiles_against_the_headers(bpf_ready, monkeypatch, fresh_program_cache):
    """The fields the raw tracepoints read then have the headers' offsets: the program is compiled again."""
    spy = CompileSpy(monkeypatch)
    monkeypatch.setattr(btf_module, "kernel_offsets", lambda: None)
    profiler = header_built("profiler")
    try:
        offsets = profiler._bpf[b"kernel_offsets"]
        assert [offsets[offsets.Key(i)].value for i in range(2)] == [0, 0]  # the headers' offsetof then
    finally:
        profiler.close()
    assert [("-DKERNEL_HEADERS" in flags) for flags in spy.cflags] == [False, True]


def header_built(kind: str):
    """One of optrace's BPF programs, loaded (nothing attached)."""
    if kind in ("profiler", "profiler-all"):
        from optrace.bpf.offcpu import WaitOptions
        from optrace.bpf.profiler import Profiler

        everything = {"python": True, "waits": WaitOptions()} if kind == "profiler-all" else {}
        program = Profiler(99, pids=[], cfi_unwind=True, **everything)
        program.load()  # also checks the count key's layout against profiler.py's
        return program
    from optrace.bpf.uprobes import BpfUprobeAttacher

    return BpfUprobeAttacher()


@pytest.mark.parametrize("kind", ["profiler", "profiler-all", "uprobes"])
def test_each_program_builds_against_the_headers_too(bpf_ready, monkeypatch, fresh_program_cache, kind):
    """Where BTF is missing, or on another architecture, this is the path taken: it must still build."""
    spy = CompileSpy(monkeypatch)
    monkeypatch.setattr(loader, "own_types_apply", lambda: False)
    header_built(kind).close()
    assert len(spy.cflags) == 1 and "-DKERNEL_HEADERS" in spy.cflags[0]
