"""Work done with another user's credentials: how root optrace opens a file *for* a process (its Python
source files), so that the kernel decides, along the whole path, whether that process's user could open it.

Deciding from mode bits misses the folders on the way (a 0644 file in root's 0700 home), groups, ACLs and
the process's mount namespace; only an open made with the user's credentials gets all of them right. Linux
keeps credentials per thread (glibc's ``setuid``/``setgroups`` wrappers change every thread of a process;
the raw system calls change only the calling one), so :func:`run_as` starts a thread that, with raw system
calls, takes the user's supplementary groups, file-system gid and uid (``setgroups``, ``setfsgid``,
``setfsuid``: the ids the kernel checks file access with) and drops every capability
but those of the process's own that decide file access (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``: a
root process may read any file, ``sudo python ~/script.py`` its user's 0700 home), checks that it holds
exactly those, runs the work and ends: the credentials go with the thread, never to be switched back.

Chosen over a child process that takes the credentials and passes descriptors back (SCM_RIGHTS): no fork of
a threaded daemon, no process to start per user (about 1 ms a batch, measured, against 20-40 ms for a
Python child), and the descriptors are already ours. The thread's real and saved uids stay root's, so the
user cannot signal it (kill permission looks at those), and the kernel marks optrace non-dumpable at the
first change of a file-system id (``suid_dumpable``), so the user cannot ptrace it either.
"""
from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from optrace.procfs import status_fields

T = TypeVar("T")

# (setgroups, getgroups, setfsuid, setfsgid, capget, capset) in the x86-64 and the generic (aarch64) tables
_CALLS = {"x86_64": (116, 115, 122, 123, 125, 126), "aarch64": (159, 158, 151, 152, 90, 91)}
SETGROUPS, GETGROUPS, SETFSUID, SETFSGID, CAPGET, CAPSET = _CALLS.get(os.uname().machine, _CALLS["x86_64"])
_CAPABILITY_VERSION_3 = 0x20080522
_NO_ID = 0xFFFFFFFF  # (uid_t)-1: setfsuid/setfsgid change nothing and answer the current id
MAX_GROUPS = 65536  # NGROUPS_MAX
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
FILE_CAPABILITIES = 1 << CAP_DAC_OVERRIDE | 1 << CAP_DAC_READ_SEARCH  # those that let a process open more


@dataclass(frozen=True)
class Credentials:
    """Whom a file is opened for: a user id, group id and supplementary groups (kernel ids, as optrace's
    own /proc shows them), and which of FILE_CAPABILITIES it holds (a bit mask)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    capabilities: int = 0


class CredentialsError(PermissionError):
    """The thread could not take the credentials (optrace lacks CAP_SETUID/CAP_SETGID and they are not its own)."""


def process_credentials(pid: int) -> Credentials | None:
    """The process's user: its real uid and gid, its supplementary groups and its file-access capabilities
    (/proc/PID/status); None when it is gone. The real ids, not the effective ones: a set-user-id program
    started by a user reads for that user, and a process whose real id is root's can take root's effective
    id back whenever it likes. Capabilities only of a process in optrace's own user namespace (one in
    another holds them over that namespace's files only: it is given none, the stricter answer)."""
    fields = status_fields(pid)
    try:
        uid, gid = int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])
        groups = tuple(sorted({int(group) for group in fields.get("Groups", "").split()}))
        capabilities = int(fields["CapEff"].split()[0], 16) & FILE_CAPABILITIES if _our_user_namespace(pid) else 0
    except (TypeError, KeyError, IndexError, ValueError):
        return None
    return Credentials(uid, gid, groups[:MAX_GROUPS], capabilities)


def _our_user_namespace(pid: int) -> bool:
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/user"), os.stat("/proc/self/ns/user")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def run_as(user: Credentials, work: Callable[[], T], seconds: float) -> T:
    """``work()`` in a new thread that holds ``user``'s credentials and no capability. Raises
    :class:`CredentialsError` when the thread cannot take them, TimeoutError when the work takes longer
    than ``seconds`` (its thread is left to end on its own), and whatever ``work`` raises."""
    outcome: list = []
    thread = threading.Thread(target=_thread_main, args=(user, work, outcome), name="optrace-as-user", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive() or not outcome:
        raise TimeoutError(errno.ETIMEDOUT, f"work as uid {user.uid} took more than {seconds:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _thread_main(user: Credentials, work: Callable[[], T], outcome: list) -> None:
    try:
        _take(user)
        outcome.append((True, work()))
    except BaseException as err:  # noqa: BLE001 - handed to the caller's thread, raised there
        outcome.append((False, err))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise CredentialsError(err, os.strerror(err))
    return result


def _take(user: Credentials) -> None:
    """This thread only: the user's groups, fs gid and fs uid, then its capabilities and no other; each
    checked after."""
    groups = (ctypes.c_uint32 * max(1, len(user.groups)))(*user.groups)
    if _groups() != set(user.groups):
        _syscall(SETGROUPS, ctypes.c_size_t(len(user.groups)), groups)  # needs CAP_SETGID
    _syscall(SETFSGID, ctypes.c_uint32(user.gid))  # answers the previous id, whether it changed or not
    _syscall(SETFSUID, ctypes.c_uint32(user.uid))
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    data[0].effective = data[0].permitted = user.capabilities  # bits 1 and 2: the low word
    _syscall(CAPSET, ctypes.byref(header), data)  # fails if the user's are more than ours
    _syscall(CAPGET, ctypes.byref(header), data)
    taken = (_syscall(SETFSUID, ctypes.c_uint32(_NO_ID)), _syscall(SETFSGID, ctypes.c_uint32(_NO_ID)), _groups())
    held = [(part.effective, part.permitted, part.inheritable) for part in data]
    if taken != (user.uid, user.gid, set(user.groups)) or held != [(user.capabilities,) * 2 + (0,), (0, 0, 0)]:
        raise CredentialsError(errno.EPERM, f"cannot take the credentials of uid {user.uid} gid {user.gid}")


def _groups() -> set[int]:
    count = _syscall(GETGROUPS, ctypes.c_int(0), None)
    buffer = (ctypes.c_uint32 * max(1, count))()
    count = _syscall(GETGROUPS, ctypes.c_int(count), buffer)
    return set(buffer[:count])
