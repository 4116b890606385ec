"""The user side of process images (images.c): the executable mappings of each process exec'd during the
session, as the kernel recorded them, read for the processes user space looks at (those sampled) and forgotten
once it is done with them.

The image's fields are raw facts: file identities as the kernel holds them (``dev`` converted here to stat's
encoding, so an identity is the unwind cache's key: device, inode, size, mtime in ns), the executable's text
range, the dynamic linker's load address, the process's root directory and mount namespace (whether its paths
are ours). frontend/unwind/images.py turns one into the mappings the unwinder takes.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from optrace.bpf.btf import BtfTypes, vmlinux_types
from optrace.bpf.pidtables import forget_pid

# enum image_offset in images.c, in order: (struct, member path) of each field it reads
IMAGE_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("task_struct", ("mm",)), ("task_struct", ("files",)), ("task_struct", ("fs",)), ("task_struct", ("nsproxy",)),
    ("linux_binprm", ("file",)), ("file", ("f_inode",)), ("inode", ("i_ino",)), ("inode", ("i_sb",)),
    ("inode", ("i_size",)), ("inode", ("i_mtime_sec",)), ("inode", ("i_mtime_nsec",)), ("super_block", ("s_dev",)),
    ("mm_struct", ("start_code",)), ("mm_struct", ("end_code",)), ("mm_struct", ("saved_auxv",)),
    ("files_struct", ("fdt",)), ("fdtable", ("max_fds",)), ("fdtable", ("fd",)),
    ("fs_struct", ("root", "dentry")), ("dentry", ("d_inode",)), ("nsproxy", ("mnt_ns",)),
    ("mnt_namespace", ("ns", "inum")),
)
# before Linux 6.7 an inode's mtime was a struct timespec64 (i_mtime, then __i_mtime): its tv_sec and tv_nsec
MTIME_FALLBACKS = (("__i_mtime",), ("i_mtime",))
IMAGE_COUNTERS = ("images_full", "image_maps_dropped", "exit_copies", "images_unknown_fields",
                  "copies_over_quota")  # enum image_counter
IMAGE_INCOMPLETE = 1
MAX_MAPS = 24  # IMAGE_MAPS
PATH_BYTES = 256  # IMAGE_PATH
_FILE = struct.Struct("<QQQII")  # struct image_file: ino, size, mtime_ns, dev, pad
_HEAD = struct.Struct("<QQQQ")  # exec_epoch, start_code, end_code, interp_base
_TAIL = struct.Struct("<QIIIIII")  # root_ino, root_dev, mnt_ns, count, dropped, flags, pad
_MAP = struct.Struct("<QQQQ")  # start, end, pgoff, epoch (then the file)

FileIdentity = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns): the unwind cache's key


@dataclass(frozen=True)
class ImageMap:
    start: int
    end: int
    offset: int  # file offset of ``start``
    epoch: int
    file: FileIdentity


@dataclass(frozen=True)
class ProcessImage:
    """What images.c recorded of a process since its exec. ``exe``: None when its file was not read."""

    exec_epoch: int
    start_code: int
    end_code: int
    interp_base: int
    exe: FileIdentity | None
    root: tuple[int, int]  # (st_dev, st_ino) of its root directory
    mnt_ns: int
    maps: tuple[ImageMap, ...]
    dropped: int  # mappings that did not fit
    incomplete: bool  # an mprotect made memory executable: a mapping may be missing
    path: str = ""  # the exec'd path as passed to execve (maybe relative)

    @property
    def complete(self) -> bool:
        return not self.dropped and not self.incomplete


def stat_dev(kernel_dev: int) -> int:
    """The kernel's dev_t (MAJOR << 20 | MINOR) as stat gives it (new_encode_dev)."""
    major, minor = kernel_dev >> 20, kernel_dev & 0xFFFFF
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def _identity(raw: bytes, at: int) -> FileIdentity | None:
    ino, size, mtime_ns, dev, _ = _FILE.unpack_from(raw, at)
    return (stat_dev(dev), ino, size, mtime_ns) if ino else None


def parse_image(raw: bytes) -> ProcessImage:
    exec_epoch, start_code, end_code, interp_base = _HEAD.unpack_from(raw)
    at = _HEAD.size
    exe = _identity(raw, at)
    at += _FILE.size
    root_ino, root_dev, mnt_ns, count, dropped, flags, _ = _TAIL.unpack_from(raw, at)
    at += _TAIL.size
    maps = []
    for i in range(min(count, MAX_MAPS)):
        start, end, offset, epoch = _MAP.unpack_from(raw, at)
        identity = _identity(raw, at + _MAP.size)
        if identity is not None:
            maps.append(ImageMap(start, end, offset, epoch, identity))
        at += _MAP.size + _FILE.size
    at = _HEAD.size + _FILE.size + _TAIL.size + MAX_MAPS * (_MAP.size + _FILE.size)
    path = os.fsdecode(raw[at:at + PATH_BYTES].split(b"\0", 1)[0])
    return ProcessImage(exec_epoch, start_code, end_code, interp_base, exe, (stat_dev(root_dev), root_ino), mnt_ns,
                        tuple(maps), dropped, bool(flags & IMAGE_INCOMPLETE), path)


def image_offsets(types: BtfTypes | None) -> list[int] | None:
    """The offsets images.c reads (enum image_offset's order), None when the kernel's BTF lacks one."""
    if types is None:
        return None
    offsets = []
    for struct_name, path in IMAGE_FIELDS:
        found = _path_offset(types, struct_name, path)
        if found is None and path[0] in ("i_mtime_sec", "i_mtime_nsec"):
            tail = 0 if path[0] == "i_mtime_sec" else 8  # struct timespec64's tv_sec, tv_nsec
            found = next((base + tail for old in MTIME_FALLBACKS
                          if (base := _path_offset(types, "inode", old)) is not None), None)
        if found is None:
            return None
        offsets.append(found)
    return offsets


def _path_offset(types: BtfTypes, struct_name: str, path: tuple[str, ...]) -> int | None:
    """The byte offset of ``struct_name.a.b``: a member, then members of its struct (by the member's type)."""
    total, name = 0, struct_name
    for member in path:
        found = types.member_offset(name, member)
        if found is None:
            return None
        total += found
        name = types.member_struct_name(name, member) or ""
    return total


class ProcessImages:
    """images.c's maps of a loaded program: the offsets it reads set from the kernel's BTF (no image is
    recorded without them), an image read or forgotten by pid, its counters."""

    def __init__(self, bpf) -> None:
        self._bpf = bpf
        self._images = bpf[b"images"]
        self.enabled = False

    def start(self) -> None:
        """Set the offsets images.c reads (0.05-0.1 s of BTF reading: off the way to the first sample); images
        are recorded from now on."""
        offsets = image_offsets(vmlinux_types())
        if offsets is not None:
            table = self._bpf[b"image_offsets"]
            for index, offset in enumerate(offsets):
                table[table.Key(index)] = table.Leaf(offset)
        self.enabled = offsets is not None

    def image(self, pid: int) -> ProcessImage | None:
        """The process's image, None when it has none (it was running before the session, or did not fit)."""
        try:
            value = self._images[self._images.Key(pid)]
        except KeyError:
            return None
        return parse_image(bytes(value))

    def forget(self, pid: int) -> None:
        forget_pid(self._images, pid)

    def counters(self) -> dict[str, int]:
        table = self._bpf[b"image_counters"]
        return {name: sum(table[table.Key(i)]) for i, name in enumerate(IMAGE_COUNTERS)}
