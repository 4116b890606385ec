"""Maps created and programs loaded through bpf(2) itself: the two calls that turn a stored program into a
running one (bpf/programobject.py).

Through the syscall rather than a library: BCC's own calls (libbcc_bpf's ``bcc_create_map`` and
``bcc_prog_load``) take no expected attach type (a uprobe_multi program needs one) and print the verifier's
log to stderr; libbpf's take options structs that change with its version. ``union bpf_attr`` is the
kernel's ABI. The three cost the same (the kernel does the work: see bench/README.md's startup section).
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import struct

from optrace.kernel import BPF_MAP_CREATE, BPF_PROG_LOAD, SYS_BPF

OBJ_NAME_LEN = 16
ATTR_SIZE = 128  # of union bpf_attr, the fields after those set here zero
_MAP_CREATE = struct.Struct("<IIIIIII16s")  # map_type, key_size, value_size, max_entries, map_flags, inner, numa, name
_PROG_LOAD = struct.Struct("<IIQQIIQII16sII")  # up to expected_attach_type
LOG_SIZE = 1 << 20
LOAD_ATTEMPTS = 5  # the verifier answers EAGAIN when a signal interrupts it (libbpf tries 5 times too)
# BCC names a program after its function without these prefixes (bcc_prog_load_xattr): kept, so the
# kernel shows the same names whether a program was compiled in this run or stored.
NAME_PREFIXES = (b"kprobe__", b"kretprobe__", b"tracepoint__", b"raw_tracepoint__", b"kfunc__", b"kretfunc__",
                 b"lsm__")
_NOT_IN_NAME = re.compile(rb"[^A-Za-z0-9_.]")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfCallError(OSError):
    """A bpf(2) call the kernel refused; ``log``: the verifier's last words, for a refused program."""

    def __init__(self, err: int, what: str, log: str = "") -> None:
        super().__init__(err, f"{what}: {os.strerror(err)}" + (f" ({log})" if log else ""))
        self.log = log


def _bpf(command: int, attr: ctypes.Array) -> int:
    return _libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(command), attr, ctypes.c_uint(ATTR_SIZE))


def object_name(name: bytes) -> bytes:
    """The kernel's name of a map or program: at most 15 characters of [A-Za-z0-9_.], BCC's prefixes off."""
    for prefix in NAME_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return _NOT_IN_NAME.sub(b"_", name)[:OBJ_NAME_LEN - 1]


def create_map(map_type: int, name: bytes, key_size: int, value_size: int, max_entries: int, flags: int) -> int:
    """A new map's fd (close-on-exec, as every fd bpf(2) returns)."""
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    _MAP_CREATE.pack_into(attr, 0, map_type, key_size, value_size, max_entries, flags, 0, 0, object_name(name))
    fd = _bpf(BPF_MAP_CREATE, attr)
    if fd < 0:
        raise BpfCallError(ctypes.get_errno(), f"cannot create the BPF map {name.decode(errors='replace')}")
    return fd


def load_program(prog_type: int, name: bytes, insns: bytes, license_: bytes, kern_version: int,
                 expected_attach_type: int = 0) -> int:
    """A verified program's fd. When the verifier refuses it, the call is made again with its log on, and
    the log's last line is in the error."""
    fd, err = _load(prog_type, name, insns, license_, kern_version, expected_attach_type, None)
    if fd >= 0:
        return fd
    log = ctypes.create_string_buffer(LOG_SIZE)
    fd, second = _load(prog_type, name, insns, license_, kern_version, expected_attach_type, log)
    if fd >= 0:  # refused once, then accepted (the first was interrupted): keep it
        return fd
    lines = [line for line in log.value.decode(errors="replace").splitlines() if line.strip()]
    raise BpfCallError(err, f"cannot load the BPF program {name.decode(errors='replace')}",
                       lines[-1] if lines and second != errno.ENOSPC else "")


def _load(prog_type: int, name: bytes, insns: bytes, license_: bytes, kern_version: int,
          expected_attach_type: int, log: ctypes.Array | None) -> tuple[int, int]:
    code = ctypes.create_string_buffer(insns, len(insns))
    licence = ctypes.create_string_buffer(license_)
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    _PROG_LOAD.pack_into(attr, 0, prog_type, len(insns) // 8, ctypes.addressof(code), ctypes.addressof(licence),
                         1 if log is not None else 0, len(log) if log is not None else 0,
                         ctypes.addressof(log) if log is not None else 0, kern_version, 0, object_name(name), 0,
                         expected_attach_type)
    err = 0
    for _ in range(LOAD_ATTEMPTS):
        fd = _bpf(BPF_PROG_LOAD, attr)
        if fd >= 0:
            return fd, 0
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    return -1, err
