"""bpf/kallsymsview.py: BCC's compile runs on a thread whose /proc/kallsyms lists only the two symbols it
looks up; nothing else in the process, and nothing outside it, sees that file, and the compiled programs
call the same helpers as against the real file."""
from __future__ import annotations

import glob
import os
import struct
import subprocess
import sys

import pytest

from optrace.bpf import kallsymsview, loader
from optrace.kernel import BPF_FUNC_PROBE_READ_KERNEL, BPF_FUNC_PROBE_READ_USER, bpf_helper_loads
from support import REPO

pytestmark = pytest.mark.usefixtures("bpf_ready")

KALLSYMS = "/proc/kallsyms"
BPF_CALL = 0x85
BPF_FUNC_PROBE_READ = 4  # what BCC rewrites both to when it finds neither symbol
READER = """
int reads(struct pt_regs *ctx)
{
    u64 word = 0;
    bpf_probe_read_kernel(&word, sizeof(word), (void *)ctx->sp);
    bpf_probe_read_user(&word, sizeof(word), (void *)ctx->sp);
    return word != 0;
}
"""


def read_kallsyms() -> bytes:
    with open(KALLSYMS, "rb") as handle:
        return handle.read()


def is_the_real_file(text: bytes) -> bool:
    """The kernel's own list (compared by what it holds: its tail of BPF programs changes as they load)."""
    return len(text.splitlines()) > 10_000 and b" T bpf_probe_read_kernel\n" in text


def kallsyms_mounts(pid: int) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as handle:
        return [line for line in handle if f" {KALLSYMS} " in line]


def helper_calls(program, name: bytes) -> set[int]:
    code = program.dump_func(name)
    insns = [struct.unpack_from("<BBhi", code, at) for at in range(0, len(code), 8)]
    return {imm for op, regs, _off, imm in insns if op == BPF_CALL and regs >> 4 == 0}


def test_the_verifier_answers_for_the_helpers_bcc_looks_up():
    assert bpf_helper_loads(BPF_FUNC_PROBE_READ_KERNEL) is True
    assert bpf_helper_loads(BPF_FUNC_PROBE_READ_USER) is True
    assert bpf_helper_loads(10_000) is False


def test_the_compile_thread_alone_sees_the_short_file():
    def inside() -> tuple[bytes, list[str], list[str]]:
        return read_kallsyms(), kallsyms_mounts(os.getpid()), kallsyms_mounts(1)

    seen, main_thread_mounts, init_mounts = kallsymsview.start_compile(inside).result()
    assert seen == (b"ffffffff80000000 T bpf_probe_read_kernel\n"
                    b"ffffffff80000000 T bpf_probe_read_user\n")
    assert main_thread_mounts == [] and init_mounts == []  # private: nothing propagated, even meanwhile
    assert is_the_real_file(read_kallsyms())
    assert kallsyms_mounts(os.getpid()) == [] and kallsyms_mounts(1) == []
    assert glob.glob("/tmp/optrace-kallsyms-*") == []  # the file made is unlinked once mounted


@pytest.fixture
def reader_source(tmp_path):
    path = tmp_path / "reader.c"
    path.write_text(READER)
    return path


def test_programs_compiled_in_the_view_call_the_helpers_themselves(reader_source, fresh_program_cache):
    program = loader.load_bcc([reader_source])
    try:
        calls = helper_calls(program, b"reads")
    finally:
        program.cleanup()
    assert {BPF_FUNC_PROBE_READ_KERNEL, BPF_FUNC_PROBE_READ_USER} <= calls
    assert BPF_FUNC_PROBE_READ not in calls


class RefusingLibc:
    """libc whose unshare succeeds without effect and whose mounts are refused, recording the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def unshare(self, flags: int) -> int:
        self.calls.append(("unshare", flags))
        return 0

    def mount(self, source, target, *rest) -> int:
        self.calls.append(("mount", source, target))
        return -1


def test_nothing_is_mounted_over_kallsyms_unless_the_namespace_is_private(monkeypatch, reader_source,
                                                                         fresh_program_cache):
    libc = RefusingLibc()
    monkeypatch.setattr(kallsymsview, "_libc", libc)
    assert is_the_real_file(kallsymsview.start_compile(read_kallsyms).result())
    assert [call[0] for call in libc.calls] == ["unshare", "mount"] and libc.calls[1][2] == b"/"
    program = loader.load_bcc([reader_source])  # and BCC compiles against it as before
    try:
        assert {BPF_FUNC_PROBE_READ_KERNEL, BPF_FUNC_PROBE_READ_USER} <= helper_calls(program, b"reads")
    finally:
        program.cleanup()


def test_without_the_verifiers_answer_the_real_file_is_read(monkeypatch):
    monkeypatch.setattr(kallsymsview, "bpf_helper_loads", lambda helper: None)
    assert kallsymsview.short_kallsyms() is None
    assert is_the_real_file(kallsymsview.start_compile(read_kallsyms).result())


def test_a_shared_root_does_not_carry_the_mount_out(tmp_path):
    """Where / is a shared mount (systemd makes it so), a bind mount made before the thread's copies were
    made private would propagate to the process's own namespace: run in one like that."""
    script = ("import os\n"
              "from optrace.bpf import kallsymsview\n"
              "def mounts():\n"
              "    return [line for line in open(f'/proc/{os.getpid()}/mountinfo') if ' /proc/kallsyms ' in line]\n"
              "inside = kallsymsview.start_compile(lambda: (open('/proc/kallsyms').read(), mounts())).result()\n"
              "print(len(inside[0].splitlines()), len(inside[1]), len(mounts()))\n")
    done = subprocess.run(["unshare", "--mount", "--propagation", "shared", sys.executable, "-c", script],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "0", "0"]


def test_a_failure_on_the_compile_thread_reaches_the_waiter(monkeypatch):
    with pytest.raises(ZeroDivisionError):
        kallsymsview.start_compile(lambda: 1 / 0).result(timeout=30)

    def broken() -> None:
        raise RuntimeError("view")

    monkeypatch.setattr(kallsymsview, "enter_short_kallsyms", broken)
    with pytest.raises(RuntimeError, match="view"):  # not a wait for ever
        kallsymsview.start_compile(read_kallsyms).result(timeout=30)
