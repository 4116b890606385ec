"""Kernel field offsets from BTF (bpf/btf.py): a hand-built BTF blob (anonymous members, bitfield offsets),
the running kernel's BTF against bpftool's reading of it, and bad input (None, never an exception)."""
from __future__ import annotations

import re
import struct
import subprocess

from hypothesis import given, settings, strategies as st

from optrace.bpf.btf import HEADER, VMLINUX, BtfError, BtfTypes, kernel_offsets


def blob(types: bytes, strings: bytes) -> bytes:
    return HEADER.pack(0xEB9F, 1, 0, HEADER.size, 0, len(types), len(types), len(strings)) + types + strings


def btf_type(name_off: int, kind: int, vlen: int, size: int, kind_flag: int = 0) -> bytes:
    return struct.pack("<III", name_off, kind_flag << 31 | kind << 24 | vlen, size)


def member(name_off: int, type_id: int, offset: int) -> bytes:
    return struct.pack("<III", name_off, type_id, offset)


STRINGS = b"\0int\0task_struct\0pid\0tgid\0linux_binprm\0filename\0"
NAME = {name: STRINGS.index(b"\0" + name.encode() + b"\0") + 1 for name in
        ("int", "task_struct", "pid", "tgid", "linux_binprm", "filename")}


def kernel_like() -> bytes:
    """1 int; 2 an anonymous union {int pid; int tgid @32 bits}; 3 task_struct {int @0; <anon 2> @64}
    (bitfield-style offsets: kind_flag); 4 linux_binprm {int filename @96 bits}."""
    types = btf_type(NAME["int"], 1, 0, 4) + struct.pack("<I", 32)
    types += btf_type(0, 5, 2, 8) + member(NAME["pid"], 1, 0) + member(NAME["tgid"], 1, 32)
    types += btf_type(NAME["task_struct"], 4, 2, 16, kind_flag=1) + member(0, 1, 0) + member(0, 2, 64)
    types += btf_type(NAME["linux_binprm"], 4, 1, 16) + member(NAME["filename"], 1, 96)
    return blob(types, STRINGS)


def test_offsets_inside_anonymous_members_and_with_bitfield_encoding():
    types = BtfTypes(kernel_like())
    assert types.member_offset("task_struct", "tgid") == 12  # 64 bits of the anonymous union + 32
    assert types.member_offset("task_struct", "pid") == 8
    assert types.member_offset("linux_binprm", "filename") == 12
    assert types.member_offset("linux_binprm", "tgid") is None
    assert types.member_offset("nosuch", "tgid") is None


def test_a_file_that_is_not_btf_gives_none(tmp_path):
    bad = tmp_path / "vmlinux"
    for data in (b"", b"\x9f\xeb", b"\0" * 64, kernel_like()[:40]):
        bad.write_bytes(data)
        kernel_offsets.cache_clear()
        assert kernel_offsets(str(bad)) is None
    kernel_offsets.cache_clear()
    assert kernel_offsets(str(tmp_path / "missing")) is None
    kernel_offsets.cache_clear()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 400))
def test_corrupt_blobs_never_raise_anything_but_btf_errors(noise, at):
    data = bytearray(kernel_like())
    data[at:at + len(noise)] = noise
    try:  # these two kernel_offsets turns into None; anything else fails the test
        BtfTypes(bytes(data)).member_offset("task_struct", "tgid")
    except (BtfError, struct.error):
        pass


def bpftool_offset(struct_name: str, member_name: str) -> int:
    """bpftool's reading of the kernel's BTF: the member's bits_offset (top-level members only)."""
    dump = subprocess.run(["bpftool", "btf", "dump", "file", VMLINUX, "format", "raw"], capture_output=True,
                          text=True, check=True).stdout
    block = re.search(rf"^\[\d+\] STRUCT '{struct_name}' size=\d+ vlen=\d+\n((?:\t.*\n)+)", dump, re.M).group(1)
    return int(re.search(rf"'{member_name}' type_id=\d+ bits_offset=(\d+)", block).group(1)) // 8


def test_the_running_kernels_offsets_agree_with_bpftool():
    kernel_offsets.cache_clear()
    found = kernel_offsets()
    assert found is not None, "this kernel has BTF (NOTES): the offsets must be found"
    assert found.task_tgid == bpftool_offset("task_struct", "tgid")
    assert found.binprm_filename == bpftool_offset("linux_binprm", "filename")
    assert found.task_start_time == bpftool_offset("task_struct", "start_time")
    assert found.task_runtime == (bpftool_offset("task_struct", "se")
                                  + bpftool_offset("sched_entity", "sum_exec_runtime"))
