"""The JIT agent API: a runtime (or a test) tells profilers about the code it generates.

In the spirit of OProfile's libopagent (``op_open_agent``, ``op_write_native_code``,
``op_write_debug_line_info``, ``op_unload_native_code``, ``op_close_agent``), but writing the two formats
today's profilers read, without root:

- ``/tmp/perf-PID.map`` (created with O_EXCL, or appended to if it is already our own regular file: never
  through a planted symlink, FIFO or hard link; one ``START SIZE name`` line per function), and
- a jitdump ``jit-PID.dump`` in a private new directory (``$OPTRACE_JITDUMP_DIR``, ``$JITDUMPDIR`` or
  ``~/.debug/jit``, like perf's JVMTI agent), with the code bytes when given. Like that agent, it maps the
  dump's first page PROT_READ|PROT_EXEC so that a profiler (optrace, ``perf record``) sees the dump in the
  process's mappings (it stays mapped after close, until exit); ``perf inject --jit`` then turns it into
  per-function ELF files.

Neither format has an "unload" record: :meth:`JitAgent.unload_native_code` only forgets the code, and the
next code written at the address supersedes it (profilers name samples after the newest code there).
Debug line info must be given before the code it describes (perf attaches it to the next load).
All methods are safe to call from several threads.
"""
from __future__ import annotations

import mmap
import os
import stat
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from optrace.jitmaps import jitdump as jd

EM_X86_64 = 62
# Closed agents' dump markers stay mapped until the process exits, so that a profiler polling
# /proc/PID/maps (optrace drains about once a second) still finds a dump written and closed in between.
_KEPT_MARKERS: list[mmap.mmap] = []


@dataclass(frozen=True)
class DebugLine:
    """Source line for the code starting at ``address`` (until the next entry)."""

    address: int
    lineno: int
    filename: str


class AgentError(Exception):
    """The agent could not open or write its files (e.g. someone else's file sits at the perf-map path)."""


def host_elf_machine() -> int:
    """e_machine of this interpreter (what jitdump's ``elf_mach`` and perf's ELF output need)."""
    try:
        with open("/proc/self/exe", "rb") as f:
            head = f.read(20)
        return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    except OSError:
        return EM_X86_64


def default_dump_dir() -> str:
    base = os.environ.get("OPTRACE_JITDUMP_DIR") or os.environ.get("JITDUMPDIR") or \
        os.path.join(os.path.expanduser("~"), ".debug", "jit")
    os.makedirs(base, mode=0o700, exist_ok=True)
    return tempfile.mkdtemp(prefix=time.strftime("optrace-jit-%Y%m%d."), dir=base)


OWN_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open_own_file(path: str, access: int, mode: int, truncate: bool = False) -> int:
    """Create ``path`` exclusively, as perf's agents do; if it already exists, use it only if it is a
    regular file of ours with one link (never a planted symlink, FIFO or hard link: opened with
    O_NOFOLLOW|O_NONBLOCK, so nothing blocks, and checked on the descriptor). Raises AgentError, OSError."""
    try:
        return os.open(path, access | os.O_CREAT | os.O_EXCL | OWN_FILE_FLAGS, mode)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, access | OWN_FILE_FLAGS)
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a FIFO nobody reads; EACCES: someone else's
        raise AgentError(f"{path} exists and cannot be used ({exc.strerror}): remove it") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise AgentError(f"{path} exists and is not a regular file of uid {os.geteuid()} with one link: "
                         "remove it")
    if truncate:
        os.ftruncate(fd, 0)
    return fd


class JitAgent:
    """One process's JIT registration. Use :func:`open_agent`; close it (or use ``with``) when done."""

    def __init__(self, dump_dir: str | None = None, perf_map: bool = True, jitdump: bool = True,
                 perf_map_dir: str = "/tmp") -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._code: dict[int, int] = {}  # address -> code_index of the live code there
        self._pending_lines: dict[int, list[DebugLine]] = {}
        self._next_index = 0
        self._marker: mmap.mmap | None = None
        self.perf_map_path: str | None = None
        self.jitdump_path: str | None = None
        self._map_fd = self._dump_fd = None
        try:
            if perf_map:
                self.perf_map_path = os.path.join(perf_map_dir, f"perf-{self.pid}.map")
                self._map_fd = _open_own_file(self.perf_map_path, os.O_WRONLY | os.O_APPEND, 0o644)
            if jitdump:
                self._open_jitdump(dump_dir or default_dump_dir())
        except AgentError:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise AgentError(f"cannot open JIT agent files: {exc}") from None

    def _open_jitdump(self, directory: str) -> None:
        self.jitdump_path = os.path.join(directory, f"jit-{self.pid}.dump")
        self._dump_fd = _open_own_file(self.jitdump_path, os.O_RDWR, 0o600, truncate=True)
        os.write(self._dump_fd, jd.encode_header(self.pid, host_elf_machine(), time.monotonic_ns()))
        self._marker = mmap.mmap(self._dump_fd, jd.HEADER_SIZE, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_EXEC)

    def __enter__(self) -> JitAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write_native_code(self, name: str, address: int, size: int, code: bytes | None = None) -> None:
        """Announce ``size`` bytes of code named ``name`` at ``address`` (``code``: its bytes, optional)."""
        if size <= 0 or address < 0:
            raise ValueError("address must be >= 0 and size > 0")
        if code is not None and len(code) != size:
            raise ValueError(f"code is {len(code)} bytes but size is {size}")
        name = " ".join(name.replace("\0", " ").splitlines()).strip() or "[anonymous]"  # same in both files
        with self._lock:
            self._check_open()
            if self._map_fd is not None:
                os.write(self._map_fd, f"{address:x} {size:x} {name}\n".encode("utf-8", "replace"))
            if self._dump_fd is not None:
                self._write_load(name, address, size, code)
            self._code[address] = self._next_index
            self._next_index += 1

    def _write_load(self, name: str, address: int, size: int, code: bytes | None) -> None:
        lines = self._pending_lines.pop(address, None)
        if lines:
            entries = tuple(jd.DebugEntry(line.address, line.lineno, 0, line.filename) for line in lines)
            os.write(self._dump_fd, jd.encode_debug_info(jd.DebugInfo(time.monotonic_ns(), address, entries)))
        # The format has no "no code" case (perf inject reads code_size bytes at the record's end): zeros.
        load = jd.CodeLoad(time.monotonic_ns(), self.pid, threading.get_native_id(), address, address,
                           size, self._next_index, name, code if code is not None else bytes(size))
        os.write(self._dump_fd, jd.encode_load(load))

    def write_debug_line_info(self, address: int, lines: Sequence[DebugLine]) -> None:
        """Source lines for the code that will be written at ``address`` (call before write_native_code)."""
        with self._lock:
            self._check_open()
            if address in self._code:
                raise ValueError(f"code at 0x{address:x} was already written: give its line info first "
                                 "(jitdump attaches debug info to the next code load)")
            self._pending_lines[address] = list(lines)

    def unload_native_code(self, address: int) -> None:
        """Forget the code at ``address`` (neither format records unloads; see the module docstring)."""
        with self._lock:
            self._check_open()
            if self._code.pop(address, None) is None:
                raise ValueError(f"no code was written at 0x{address:x}")

    def close(self) -> None:
        """Write the jitdump CLOSE record and release everything. Idempotent."""
        with self._lock:
            if self._dump_fd is not None:
                try:
                    os.write(self._dump_fd, jd.encode_close(time.monotonic_ns()))
                finally:
                    if self._marker is not None:
                        _KEPT_MARKERS.append(self._marker)
                        self._marker = None
                    os.close(self._dump_fd)
                    self._dump_fd = None
            if self._map_fd is not None:
                os.close(self._map_fd)
                self._map_fd = None
            self._code.clear()

    def _check_open(self) -> None:
        if self._map_fd is None and self._dump_fd is None:
            raise AgentError("the JIT agent is closed")


def open_agent(**options: object) -> JitAgent:
    """Open the agent for the current process (``op_open_agent``)."""
    return JitAgent(**options)
