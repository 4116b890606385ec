"""Where unwind tables are converted: in the calling thread (:class:`InProcessBuilder`: record, tests) or
in a child process (:class:`ChildProcessBuilder`: serve).

Converting a large file's CFI is pure Python, up to BUILD_SECONDS of CPU per file. In serve that work
shared one interpreter with the drain loop, which names other users' files under its own budgets: with
both taking turns on the GIL, drains stood still for 12-18 s in tests/hostile's live test, so serve's
default call graph had to stay ``fp``. The child has its own interpreter (and CPU).

The child is given each file as the descriptor the parent opened and checked under the hostile-file
rules (SCM_RIGHTS), with the size and read time the parent allowed. Started as root, it drops to
nobody with no capabilities and no new privileges before it reads anything: a crafted file that subverted
the parser would own an unprivileged process holding one read-only descriptor. It is started with
``python -I`` (nothing imported from the working directory or PYTHON* variables). An idle child exits
after IDLE_SECONDS (its heap goes with it; a thread reaps it); a request that meets a child just leaving
is sent again to a new one, and a dead, stuck or stopped child costs the file being converted.

Protocol over a Unix stream socket: a request is a framed JSON object (``name``, ``size``, ``seconds``)
with the descriptor attached; the answer is a framed JSON object (the table's fields, ``build_id``,
``loads``, or ``error`` and ``kind``) followed by the framed rows. A frame is a 4-byte little-endian
length and that many bytes; the parent reads at most MAX_ANSWER_BYTES.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from optrace.fileaccess import BoundedFile, BudgetExceeded
from optrace.frontend.symbols.buildid import FileIdentity
from optrace.frontend.symbols.elffile import ElfFormatError
from optrace.frontend.symbols.leb128 import DwarfError
from optrace.frontend.unwind.table import MAX_ROWS, ROW
from optrace.frontend.unwind.unwindfile import UnwindFile, convert_file, decode_unwind_file, encode_unwind_file

IDLE_SECONDS = 30.0
# Wall time the parent waits for one answer: the child's CPU budget (BUILD_SECONDS) and read budget are
# its own; this is for a child that is stopped or starved.
ANSWER_SECONDS = 120.0
MAX_ANSWER_BYTES = MAX_ROWS * ROW.size + (1 << 20)
NOBODY = 65534
_FRAME = struct.Struct("<I")
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
_ERRORS: dict[str, Callable[[str], Exception]] = {
    "budget": BudgetExceeded, "unreadable": lambda text: OSError(0, text), "elf": ElfFormatError,
    "cfi": DwarfError,
}


class TableBuilder(Protocol):
    def convert(self, reader: BoundedFile, identity: FileIdentity | None,
                stop: Callable[[], bool]) -> UnwindFile: ...

    def close(self) -> None: ...


class InProcessBuilder:
    """Converts in the calling thread."""

    def convert(self, reader: BoundedFile, identity: FileIdentity | None,
                stop: Callable[[], bool]) -> UnwindFile:
        return convert_file(reader, identity, stop)

    def close(self) -> None:
        pass


class ChildProcessBuilder:
    """Converts in one child process, one file at a time (callers on several threads take turns)."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self.started = 0  # children started, for tests and stats

    def convert(self, reader: BoundedFile, identity: FileIdentity | None,
                stop: Callable[[], bool]) -> UnwindFile:
        request = _framed(json.dumps({"name": reader.name, "size": reader.size,
                                      "seconds": reader.seconds_left()}).encode())
        with self._lock:
            try:
                try:
                    header, rows = self._ask(request, reader.fd, stop)
                except _ChildGone:  # it was leaving (idle) as we asked: once more, with a new one
                    self._stop_child()
                    header, rows = self._ask(request, reader.fd, stop)
            except BaseException:
                self._stop_child()  # its state is unknown: the next file gets a new one
                raise
        if "error" in header:
            raise _ERRORS.get(header["kind"], DwarfError)(str(header["error"]))
        return decode_unwind_file(header, rows, identity)

    def close(self) -> None:
        with self._lock:
            self._stop_child()

    def _ask(self, request: bytes, fd: int, stop: Callable[[], bool]) -> tuple[dict, bytes]:
        sock = self._connected()
        try:
            socket.send_fds(sock, [request], [fd])
        except (BrokenPipeError, ConnectionResetError) as err:
            raise _ChildGone("the table builder exited") from err
        header = json.loads(_receive(sock, stop))
        return header, (_receive(sock, stop) if "error" not in header else b"")

    def _connected(self) -> socket.socket:
        if self._child is not None and self._child.poll() is None:
            return self._sock
        self._stop_child()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            # -I: neither the working directory (-m would put it first on sys.path: a json.py there would
            # run as root) nor PYTHON* variables shape what the child imports.
            self._child = subprocess.Popen([sys.executable, "-I", "-m", __name__, str(theirs.fileno()),
                                            str(self.idle_seconds)],
                                           pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Reaped as soon as it exits (idle): no zombie under serve until the next file.
        threading.Thread(target=self._child.wait, name="optrace-unwind-child", daemon=True).start()
        self._sock = ours
        self.started += 1
        return ours

    def _stop_child(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._child is not None:
            if self._child.poll() is None:
                self._child.kill()
            self._child.wait()
            self._child = None

    @property
    def child_pid(self) -> int | None:
        return self._child.pid if self._child is not None and self._child.poll() is None else None


class _ChildGone(DwarfError):
    """The child closed its end (it exited)."""


# -- the wire -----------------------------------------------------------------------------------------
def _framed(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload)) + payload


def _receive(sock: socket.socket, stop: Callable[[], bool] = lambda: False,
             seconds: float = ANSWER_SECONDS) -> bytes:
    """One frame; DwarfError when ``stop`` says so first, BudgetExceeded after ``seconds``."""
    deadline = time.monotonic() + seconds
    (length,) = _FRAME.unpack(_exactly(sock, _FRAME.size, stop, deadline))
    if length > MAX_ANSWER_BYTES:
        raise DwarfError(f"the table builder sent {length} bytes")
    return _exactly(sock, length, stop, deadline)


def _readable(sock: socket.socket, seconds: float) -> bool:
    """poll, not select: serve may hold thousands of connections, and select() fails on a descriptor
    numbered 1024 or more (the child inherits the number its socket had in serve)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


def _exactly(sock: socket.socket, size: int, stop: Callable[[], bool], deadline: float) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        if stop():
            raise DwarfError("stopped: the session is ending")
        if time.monotonic() > deadline:
            raise BudgetExceeded("the table builder did not answer in time")
        if not _readable(sock, 0.2):
            continue
        try:
            count = sock.recv_into(view[got:])
        except ConnectionResetError:
            count = 0
        if not count:
            raise _ChildGone("the table builder exited")
        got += count
    return bytes(buffer)


# -- the child ----------------------------------------------------------------------------------------
def _error_kind(err: Exception) -> str:
    for kind, cls in (("budget", BudgetExceeded), ("unreadable", OSError), ("elf", ElfFormatError)):
        if isinstance(err, cls):
            return kind
    return "cfi"


def _drop_privileges() -> None:
    """As root: nobody, no groups, no capabilities, no new privileges; the parent's death ends us."""
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)  # also clears the permitted and effective capability sets
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # after setuid, which clears it
    if os.getppid() == 1:
        raise SystemExit(0)  # the parent died before the line above
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _serve_one(sock: socket.socket, idle_seconds: float) -> bool:
    """Answer one request; False once the parent is gone or we were idle for ``idle_seconds``."""
    if not _readable(sock, idle_seconds):
        return False
    message, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 1)
    if not message or not fds:
        return False
    (length,) = _FRAME.unpack_from(message)
    while len(message) < _FRAME.size + length:
        more = sock.recv(_FRAME.size + length - len(message))
        if not more:
            return False
        message += more
    request = json.loads(message[_FRAME.size:])
    try:
        with BoundedFile(fds[0], int(request["size"]), float(request["seconds"]), str(request["name"])) as reader:
            header, rows = encode_unwind_file(convert_file(reader))
    except Exception as err:  # noqa: BLE001 - the per-file boundary: the parent reports it
        header, rows = {"error": str(err)[:500], "kind": _error_kind(err)}, None
    sock.sendall(_framed(json.dumps(header).encode()))
    if rows is not None:
        sock.sendall(_framed(rows))
    return True


def _child_main(sock_fd: int, idle_seconds: float) -> None:
    from optrace.heap import large_blocks_mapped

    large_blocks_mapped()
    _drop_privileges()
    with socket.socket(fileno=sock_fd) as sock:
        while _serve_one(sock, idle_seconds):
            pass


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), float(sys.argv[2]))
