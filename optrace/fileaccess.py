"""The one rule for every file optrace opens on someone else's behalf.

optrace runs as root and reads files that any local user controls: the binaries and libraries their
processes map, the debug files those name, perf maps and jitdumps in /tmp, record files given to
``report``. Every such open goes through this module, so a hostile file costs its own names and nothing
else. The rule, checked on the descriptor actually opened (no check-then-open race):

- ``O_RDONLY|O_NONBLOCK|O_NOFOLLOW|O_CLOEXEC``: a FIFO cannot block the open, a planted symlink is not
  followed; the path is resolved with ``openat2`` and ``RESOLVE_NO_MAGICLINKS`` (no ``/proc/PID/fd``-style
  jumps) and, unless the caller built the path from the system's own configuration (ld.so.cache, the
  standard library folders), ``RESOLVE_NO_SYMLINKS`` for every component.
- Paths inside another process's mount namespace are resolved from an ``O_PATH`` descriptor of
  ``/proc/PID/root`` with ``RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV|RESOLVE_NO_MAGICLINKS``:
  none of that namespace's symlinks are followed and none of its mounts (bind mounts of files included)
  are crossed. Chosen over reading in a child that joins the namespace with the process's credentials
  because it needs no fork from a threaded daemon and costs one syscall; the price is that a JIT file
  behind a mount point inside a container (systemd's PrivateTmp) is refused with a warning.
- ``fstat``: a regular file, not on a pseudo or user-mounted file system (procfs, sysfs, tracefs,
  debugfs, FUSE...: ``/proc/kmsg`` is "regular" and its read blocks; a FUSE file's read can block
  forever), optionally owned by given uids and with one hard link, and at most ``max_size`` bytes.
- Reads go through :class:`BoundedFile`: never past the size ``fstat`` gave when the file was opened,
  and never longer than the policy's time budget in total; decompression is bounded in output bytes.
- A file read *for* a process, whose name the process chooses (its Python source files), is opened by a
  thread holding that process's credentials (:func:`optrace.credentials.run_as`) through the process's
  root: the kernel decides, along the whole path, whether its user could open it. Content read for a
  process from a file it maps (machine code for ``annotate``) is kept only if :func:`may_read` says, in such
  a thread, that the user may read that very file (a program it may only execute, mode 0711, is not).
"""
from __future__ import annotations

import ctypes
import errno
import io
import lzma
import os
import stat
import time
import zlib
from dataclasses import dataclass

DEFAULT_MAX_SIZE = 256 << 20
DEFAULT_READ_SECONDS = 2.0

# statfs f_type values of file systems whose "regular" files are not data on a disk (linux/magic.h).
PSEUDO_FS_TYPES = {
    0x9FA0: "procfs", 0x62656572: "sysfs", 0x64626720: "debugfs", 0x74726163: "tracefs",
    0x27E0EB: "cgroupfs", 0x63677270: "cgroup2fs", 0x73636673: "securityfs", 0xCAFE4A11: "bpffs",
    0x6165676C: "pstorefs", 0x62656570: "configfs", 0x65735546: "fuse", 0x65735543: "fusectl",
    0x1CD1: "devpts", 0x19800202: "mqueue", 0x42494E4D: "binfmt_misc", 0x6E736673: "nsfs",
    0x50495045: "pipefs", 0x534F434B: "sockfs", 0xF97CFF8C: "selinuxfs", 0x958458F6: "hugetlbfs",
}

SYS_OPENAT2 = 437  # x86-64 and aarch64 (the generic syscall table)
SYS_FACCESSAT2 = 439
AT_EMPTY_PATH = 0x1000
AT_EACCESS = 0x200
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10
AT_FDCWD = -100
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class RefusedFile(Exception):
    """The file exists but must not be used. ``reason`` is a short key, ``detail`` a sentence fragment
    ("is a symbolic link (not followed)"), ``str()`` the path and the detail. Never holds file content."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(f"{printable(path)}: {detail}")
        self.path = path
        self.reason = reason
        self.detail = detail


class BudgetExceeded(OSError):
    """A read or a decompression went past its byte or time budget (an OSError, so callers that already
    turn unreadable files into warnings handle it the same way)."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.EFBIG, what)


@dataclass(frozen=True)
class FilePolicy:
    """What a file must satisfy.

    ``owners``: the uids it may belong to (None: any owner). ``follow_symlinks``: only for paths built
    from the system's own configuration; magic links are never followed. ``single_link``: refuse a file
    with other hard links (a planted hard link to someone else's file in /tmp). ``private``: refuse a file
    with a group or other write bit (a settings file only its owner may change).
    """

    owners: frozenset[int] | None = None
    max_size: int = DEFAULT_MAX_SIZE
    follow_symlinks: bool = False
    single_link: bool = False
    read_seconds: float = DEFAULT_READ_SECONDS
    private: bool = False


ANY_FILE = FilePolicy()


def printable(text: object) -> str:
    """``text`` as one printable line: control characters (newlines, terminal escapes) become ``?``."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


# -- opening ----------------------------------------------------------------------------------------------
class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
    fd = _libc.syscall(SYS_OPENAT2, ctypes.c_int(dir_fd), os.fsencode(path), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def open_file(path: str, policy: FilePolicy = ANY_FILE, *, root_fd: int | None = None,
              shown: str | None = None) -> int | None:
    """Open ``path`` for reading under ``policy``; None when it does not exist.

    With ``root_fd`` (an ``O_PATH`` fd of ``/proc/PID/root``), ``path`` is resolved inside that process's
    root without following its symlinks or crossing its mounts. ``shown`` is the name used in messages.
    Raises :class:`RefusedFile`. The caller owns the returned descriptor.
    """
    shown = shown or path
    if root_fd is not None:
        dir_fd, resolve = root_fd, RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS
        path = path.lstrip("/") or "."
    else:
        dir_fd, resolve = AT_FDCWD, RESOLVE_NO_MAGICLINKS | (0 if policy.follow_symlinks else RESOLVE_NO_SYMLINKS)
    flags = OPEN_FLAGS & ~os.O_NOFOLLOW if policy.follow_symlinks and root_fd is None else OPEN_FLAGS
    try:
        fd = _openat2(dir_fd, path, flags, resolve)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refusal(shown, exc) from None
    return _checked(fd, shown, policy)


def open_mapped(pid: int, start: int, end: int, policy: FilePolicy = ANY_FILE, *, shown: str | None = None) -> int | None:
    """Open the very inode a process mapped at ``start-end`` (``/proc/PID/map_files``: a magic link,
    followed on purpose: it is the file the process has mapped, even if renamed, deleted or in another
    mount namespace). None when the process or the mapping is gone. Raises :class:`RefusedFile`."""
    path = f"/proc/{pid}/map_files/{start:x}-{end:x}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        raise _refusal(shown or path, exc) from None
    return _checked(fd, shown or path, policy)


def may_read(fd: int) -> bool:
    """Whether the calling thread's credentials may read the file ``fd`` is open on: the kernel's own check
    (ACLs and capabilities included) with the thread's file-system ids, groups and capabilities, as
    :func:`optrace.credentials.run_as` sets them (faccessat2 on the descriptor, AT_EACCESS)."""
    done = _libc.syscall(SYS_FACCESSAT2, ctypes.c_int(fd), b"", ctypes.c_int(os.R_OK),
                         ctypes.c_int(AT_EMPTY_PATH | AT_EACCESS))
    return done == 0


def _refusal(shown: str, exc: OSError) -> RefusedFile:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return RefusedFile(shown, "symlink", "is or passes through a symbolic link (not followed)")
    if exc.errno == errno.EXDEV:
        return RefusedFile(shown, "mount", "crosses a mount point (not followed)")
    if exc.errno == errno.ENOTDIR:
        return RefusedFile(shown, "not_regular", "has a path component that is not a directory")
    return RefusedFile(shown, "unreadable", f"cannot open: {exc.strerror or exc}")


def _checked(fd: int, shown: str, policy: FilePolicy) -> int:
    try:
        check_descriptor(fd, shown, policy)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_descriptor(fd: int, shown: str, policy: FilePolicy = ANY_FILE) -> os.stat_result:
    """Refuse (:class:`RefusedFile`) what ``policy`` does not allow; return the descriptor's stat."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise RefusedFile(shown, "not_regular", f"is {kind}")
    pseudo = pseudo_filesystem(fd)
    if pseudo:
        raise RefusedFile(shown, "pseudo_fs", f"is on {pseudo}, not a disk file system")
    if policy.single_link and st.st_nlink != 1:
        raise RefusedFile(shown, "hard_links", f"has {st.st_nlink} hard links (expected 1)")
    if policy.owners is not None and st.st_uid not in policy.owners:
        wanted = " or ".join(f"uid {u}" if u else "root" for u in sorted(policy.owners))
        raise RefusedFile(shown, "owner", f"is owned by uid {st.st_uid}, not {wanted}")
    if policy.private and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RefusedFile(shown, "writable", f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})")
    if st.st_size > policy.max_size:
        raise RefusedFile(shown, "too_large", f"is {st.st_size} bytes, over the {policy.max_size}-byte limit")
    return st


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_long * 15)]


_libc.fstatfs.argtypes = (ctypes.c_int, ctypes.POINTER(_StatFs))


def pseudo_filesystem(fd: int) -> str | None:
    """The name of the pseudo file system ``fd`` lives on, or None for an ordinary one."""
    buf = _StatFs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        return "an unknown file system"
    return PSEUDO_FS_TYPES.get(buf.f_type & 0xFFFFFFFF)


# -- reading ----------------------------------------------------------------------------------------------
class BoundedFile(io.RawIOBase):
    """A seekable, read-only view of an opened descriptor that never reads past the size the file had
    when it was checked, nor for longer than ``seconds`` in all. Owns (and closes) the descriptor."""

    def __init__(self, fd: int, size: int, seconds: float = DEFAULT_READ_SECONDS, name: str = "") -> None:
        super().__init__()
        self.fd = fd
        self.size = size
        self.name = name
        self._pos = 0
        self._deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def seconds_left(self) -> float:
        """What is left of the read time budget."""
        return max(0.0, self._deadline - time.monotonic())

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if time.monotonic() > self._deadline:
            raise BudgetExceeded(f"reading {printable(self.name)} took too long")
        left = max(0, self.size - self._pos)
        n = left if n is None or n < 0 else min(n, left)
        if n == 0:
            return b""
        data = os.pread(self.fd, n, self._pos)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


def open_reader(path: str, policy: FilePolicy = ANY_FILE, *, root_fd: int | None = None,
                shown: str | None = None) -> BoundedFile | None:
    """:func:`open_file` as a :class:`BoundedFile` (None when the file does not exist)."""
    fd = open_file(path, policy, root_fd=root_fd, shown=shown)
    return None if fd is None else reader_for(fd, policy, shown or path)


def reader_for(fd: int, policy: FilePolicy = ANY_FILE, shown: str = "") -> BoundedFile:
    """A :class:`BoundedFile` over an fd already checked with :func:`check_descriptor` (takes ownership)."""
    size = min(os.fstat(fd).st_size, policy.max_size)
    return BoundedFile(fd, size, policy.read_seconds, shown)


def read_file(path: str, policy: FilePolicy = ANY_FILE, *, root_fd: int | None = None,
              shown: str | None = None) -> bytes | None:
    """The whole file under ``policy`` (None when it does not exist). Raises RefusedFile, OSError."""
    reader = open_reader(path, policy, root_fd=root_fd, shown=shown)
    if reader is None:
        return None
    with reader:
        return reader.read()


# -- decompressing ----------------------------------------------------------------------------------------
def decompress_lzma(data: bytes, max_output: int, what: str = "xz data") -> bytes:
    """xz/lzma ``data`` inflated to at most ``max_output`` bytes. Raises BudgetExceeded, lzma.LZMAError."""
    decompressor = lzma.LZMADecompressor()
    out = decompressor.decompress(data, max_length=max_output)
    if not decompressor.eof and (decompressor.needs_input is False or len(out) >= max_output):
        raise BudgetExceeded(f"{what} inflates to more than {max_output} bytes")
    return out


def decompress_zlib(data: bytes, max_output: int, what: str = "zlib data") -> bytes:
    """zlib ``data`` inflated to at most ``max_output`` bytes. Raises BudgetExceeded, zlib.error."""
    decompressor = zlib.decompressobj()
    out = decompressor.decompress(data, max_output)
    if decompressor.unconsumed_tail:
        raise BudgetExceeded(f"{what} inflates to more than {max_output} bytes")
    return out
