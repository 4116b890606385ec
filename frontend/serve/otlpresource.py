"""What serve's OTLP resources say about the host and each process, per the semantic conventions.

The host: ``host.name``, ``host.arch`` (the conventions' names: amd64, arm64...), ``os.type``, then the
user's OTEL_RESOURCE_ATTRIBUTES (which win). A process: ``process.executable.path`` and ``.name`` (the
target of /proc/PID/exe, as the conventions say for Linux), ``process.command_line`` (its arguments
joined, cut at 4 KiB), ``container.id`` (from its cgroup, where a container runtime named one); a kernel
thread has none of them. ``process.pid`` and ``service.name`` are added by the writer (exporters/otlp.py).

A process's command line is what anyone on the host can read in /proc, but it leaves the host with the
profile: arguments that hold secrets reach the OTLP backend (docs/serve.md says so).
"""
from __future__ import annotations

import os

from optrace.exporters.otlp import Attribute
from optrace.procfs import command_line, container_id, executable

# uname's machine -> the semantic conventions' host.arch
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm32", "armv6l": "arm32",
             "i386": "x86", "i686": "x86", "ppc64le": "ppc64", "ppc64": "ppc64", "ppc": "ppc32", "s390x": "s390x",
             "ia64": "ia64"}


def host_attributes(user: tuple[tuple[str, str], ...] = ()) -> tuple[Attribute, ...]:
    uname = os.uname()
    detected: dict[str, str] = {"host.name": uname.nodename, "os.type": "linux"}
    if uname.machine in HOST_ARCH:
        detected["host.arch"] = HOST_ARCH[uname.machine]
    detected.update(user)
    return tuple(detected.items())


def process_attributes(pid: int) -> tuple[Attribute, ...]:
    """The process's attributes now (those /proc no longer has, for a process that is gone, are left out)."""
    found: list[Attribute] = []
    path = executable(pid)
    if path:
        found += [("process.executable.path", path), ("process.executable.name", os.path.basename(path))]
    arguments = command_line(pid)
    if arguments:
        found.append(("process.command_line", " ".join(arguments)))
    container = container_id(pid)
    if container:
        found.append(("container.id", container))
    return tuple(found)
