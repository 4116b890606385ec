"""BCC's compile without its pass over every kernel symbol.

BCC 0.26's clang frontend asks whether the kernel has ``bpf_probe_read_kernel`` (and ``bpf_probe_read_user``
when a program calls it) by loading the whole of /proc/kallsyms into a symbol cache, once per compile
(b_frontend_action.cc: check_bpf_probe_read_kernel, from DoMiscWorkAround): 120k symbols read, sorted,
hashed and freed for two yes/no answers, 0.18 s of CPU here (a seventh of a recording's own cost), with
no switch to turn it off.

So the compile runs on a thread of its own that has a mount namespace of its own (``unshare(CLONE_NEWNS)``
applies to the calling thread), its mounts made private first so nothing propagates out, where a file
listing only those two symbols that the kernel has is bind-mounted over /proc/kallsyms. Whether it has them
is asked of the verifier: a program calling the helper loads or it does not, the question BCC's lookup
stands for. The rest of optrace and everything it starts keep the real file; the namespace ends with the
thread. Where any step is refused (no CAP_SYS_ADMIN, a container that forbids mounts, an unknown helper
answer) the thread compiles as before, against the real file.
"""
from __future__ import annotations

import ctypes
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from optrace.kernel import BPF_FUNC_PROBE_READ_KERNEL, BPF_FUNC_PROBE_READ_USER, bpf_helper_loads

T = TypeVar("T")

KALLSYMS = b"/proc/kallsyms"
# The symbols BCC's compile looks up, with the helper each stands for.
LOOKUPS = ((b"bpf_probe_read_kernel", BPF_FUNC_PROBE_READ_KERNEL), (b"bpf_probe_read_user", BPF_FUNC_PROBE_READ_USER))
# Any kernel text address does: BCC keeps lines above the user address space, and looks at names only.
LISTED_ADDRESS = b"ffffffff80000000"
CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def start_compile(compile_: Callable[[], T]) -> Future[T]:
    """``compile_()`` started on a new thread that sees :func:`short_kallsyms` as /proc/kallsyms when that
    can be arranged, else the real file; its result (or exception) in the future."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            enter_short_kallsyms()
            future.set_result(compile_())
        except BaseException as exc:  # handed to whoever waits for the compile, which would wait forever else
            future.set_exception(exc)

    threading.Thread(target=run, name="optrace-compile", daemon=True).start()
    return future


def short_kallsyms() -> bytes | None:
    """The lines BCC's compile needs: those of :data:`LOOKUPS` whose helper the kernel has; None when the
    kernel did not say (the real file is read then)."""
    lines = []
    for name, helper in LOOKUPS:
        loads = bpf_helper_loads(helper)
        if loads is None:
            return None
        if loads:
            lines.append(b"%s T %s\n" % (LISTED_ADDRESS, name))
    return b"".join(lines)


def enter_short_kallsyms() -> bool:
    """Give the calling thread a private mount namespace whose /proc/kallsyms is :func:`short_kallsyms`;
    False (and the thread's view unchanged, or only its namespace new) when a step is refused. Never on a
    thread that lives on: it keeps the view."""
    listed = short_kallsyms()
    if listed is None:
        return False
    try:
        _checked(_libc.unshare(CLONE_NEWNS))
        _checked(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None))  # before any mount: none leaks out
        _mount_over_kallsyms(listed)
    except OSError:
        return False
    return True


def _mount_over_kallsyms(listed: bytes) -> None:
    """Bind a new file of ``listed`` over /proc/kallsyms (through its descriptor: the very file made), and
    unlink it (the mount keeps it)."""
    fd, path = tempfile.mkstemp(prefix="optrace-kallsyms-")
    try:
        os.write(fd, listed)
        _checked(_libc.mount(b"/proc/self/fd/%d" % fd, KALLSYMS, None, MS_BIND, None))
    finally:
        os.close(fd)
        os.unlink(path)


def _checked(result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
