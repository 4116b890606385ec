"""Can this machine record? Each check says ok or FAIL and, when it fails, the command that fixes it.

`optrace doctor` prints them all; whatever loads BPF (record, top, serve, the uprobe counter) calls
:func:`require_recording` first so it fails early with one line instead of a BCC compile error. Nothing
here imports BCC (it is only looked up), and nothing here prints: the doctor command does.
"""
from __future__ import annotations

import errno
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from optrace.errors import OptraceError
from optrace import kernel
from optrace.kernel import CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, bpf_map_create_errno, effective_capabilities


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # the command or action that fixes a failure
    required: bool = True  # False: informational, never makes doctor fail
    uprobes_only: bool = False  # needed by uprobe probes (count, record --uprobe), not by plain sampling

    @property
    def status(self) -> str:
        if self.ok:
            return "ok"
        return "FAIL" if self.required else "warn"


def check_privileges() -> CheckResult:
    if os.geteuid() == 0:
        return CheckResult("privileges", True, "running as root")
    caps = effective_capabilities()
    has = {name for bit, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")) if caps >> bit & 1}
    if len(has) == 2 or caps >> CAP_SYS_ADMIN & 1:
        return CheckResult("privileges", True, f"not root, but has {' + '.join(sorted(has)) or 'CAP_SYS_ADMIN'}")
    return CheckResult("privileges", False, "needs root or CAP_BPF+CAP_PERFMON", "run with sudo")


def check_bpf_syscall() -> CheckResult:
    """Create and close a one-entry array map: proves bpf() is usable without loading a program."""
    err = bpf_map_create_errno()
    if err == 0:
        return CheckResult("bpf syscall", True, "BPF_MAP_CREATE works")
    if err == errno.ENOSYS:
        return CheckResult("bpf syscall", False, "the kernel has no bpf() (CONFIG_BPF_SYSCALL off)",
                           "use a kernel built with CONFIG_BPF_SYSCALL=y")
    return CheckResult("bpf syscall", False, f"bpf(BPF_MAP_CREATE) failed: {os.strerror(err)}",
                       "run with sudo")


HEADERS_FIX = ("install the headers of this kernel (linux-headers-{release}) or boot one built with "
               "CONFIG_IKHEADERS=y (BCC then uses /sys/kernel/kheaders.tar.xz)")


def check_kernel_headers(modules: str = "/lib/modules") -> CheckResult:
    release = os.uname().release
    build = Path(f"{modules}/{release}/build/include")
    if build.is_dir():
        where = f"{build.parent} (resolves to {build.parent.resolve()})"
        headers = headers_release(build)
        if headers is not None and _major_minor(headers) != _major_minor(release):
            return CheckResult(
                "kernel headers", False,
                f"{where} holds {headers} headers for kernel {release}: BCC compiles against their struct "
                "layouts; optrace's programs read kernel structs only at offsets from the kernel's BTF (see the "
                "BTF check) and work, but a header change can break the compile",
                HEADERS_FIX.format(release=release), required=False)
        return CheckResult("kernel headers", True, where)
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        return CheckResult("kernel headers", True, "/sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS)")
    return CheckResult("kernel headers", False, f"BCC finds no headers in /lib/modules/{release}/build",
                       "sudo make setup")


def headers_release(include: Path) -> str | None:
    """The kernel release a header tree was made for (its generated utsrelease.h), None if unknown."""
    try:
        text = (include / "generated" / "utsrelease.h").read_text(errors="replace")[:4096]
    except OSError:
        return None
    match = re.search(r'UTS_RELEASE\s+"([^"]+)"', text)
    return match.group(1) if match else None


def _major_minor(release: str) -> tuple[str, ...]:
    return tuple(release.split("-")[0].split(".")[:2])


def check_tracefs() -> CheckResult:
    """Read /proc/self/mounts (readable by anyone; /sys/kernel/tracing itself is root-only)."""
    mounted = kernel.tracefs_mount_points()
    if mounted:
        return CheckResult("tracefs", True, f"mounted at {mounted[0]}", uprobes_only=True)
    return CheckResult("tracefs", False, "not mounted: uprobes could not be detached cleanly",
                       "sudo mount -t tracefs nodev /sys/kernel/tracing", uprobes_only=True)


def check_syscall_tracepoints() -> CheckResult:
    name = "syscall tracepoints"
    if kernel.syscall_events_available():
        return CheckResult(name, True, "raw user stacks once a process's maps are read", required=False)
    if any(os.path.isdir(root) and not os.access(root, os.X_OK) for root in kernel.TRACEFS_DIRS):
        return CheckResult(name, False, "cannot tell: tracefs is readable by root only", required=False)
    return CheckResult(name, False, "none usable: every user stack is a build-id stack, slower per sample",
                       "a kernel with CONFIG_FTRACE_SYSCALLS=y and CONFIG_DEBUG_INFO_BTF=y, tracefs mounted",
                       required=False)


def check_off_cpu() -> CheckResult:
    """record --off-cpu's hook; informational (CPU profiles do not need it)."""
    version = kernel.kernel_version()
    needed = kernel.OFF_CPU_MIN_KERNEL
    if version >= needed:
        return CheckResult("off-CPU", True, f"{kernel.OFF_CPU_HOOK} (kprobes are not needed)", required=False)
    return CheckResult("off-CPU", False, f"kernel {version[0]}.{version[1]}: the {kernel.OFF_CPU_HOOK} has no "
                       f"prev_state before {needed[0]}.{needed[1]}", "a newer kernel for --off-cpu", required=False)


def check_bcc() -> CheckResult:
    """Looks BCC up without importing it (an import compiles nothing but loads libbcc and LLVM)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.origin:
        if venv_hides_system_packages():
            return CheckResult("BCC", False, f"this virtual environment ({sys.prefix}) does not see the system's "
                               "packages, where Debian's python3-bpfcc puts BCC",
                               f"recreate it: /usr/bin/python3 -m venv --system-site-packages {sys.prefix}")
        return CheckResult("BCC", False, "python module bcc not found", "sudo apt-get install python3-bpfcc")
    package = Path(spec.origin).parent
    if not (package / "libbcc.py").exists():
        return CheckResult("BCC", False, f"{package} is not BCC (PyPI's bcc is another project)",
                           "pip uninstall bcc; sudo apt-get install python3-bpfcc")
    return CheckResult("BCC", True, str(package))


def venv_hides_system_packages() -> bool:
    """Running in a venv made without --system-site-packages (BCC's Python bindings are system packages)."""
    if sys.prefix == sys.base_prefix:
        return False
    try:
        config = (Path(sys.prefix) / "pyvenv.cfg").read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"^include-system-site-packages\s*=\s*true\s*$", config, re.M | re.I) is None


def check_perf_event_paranoid() -> CheckResult:
    try:
        value = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    except OSError:
        value = "unreadable"
    note = "no limit for root or CAP_PERFMON" if os.geteuid() == 0 else "root or CAP_PERFMON bypass it"
    return CheckResult("perf_event_paranoid", True, f"{value} ({note})", required=False)


def check_btf() -> CheckResult:
    from optrace.bpf.btf import VMLINUX, kernel_offsets

    if kernel_offsets() is not None:
        return CheckResult("BTF", True, f"{VMLINUX}: field offsets for the sched raw tracepoints", required=False)
    return CheckResult("BTF", False, f"no usable {VMLINUX}: the sched raw tracepoints read task_struct and "
                       "linux_binprm at the headers' offsets (right only with this kernel's headers: children "
                       "of targets and exec'd files depend on them)", "a kernel with CONFIG_DEBUG_INFO_BTF=y",
                       required=False)


PROGRAM_KINDS = {  # a program's main source -> what loads it
    "profile.c": "record, top, serve",
    "offcpu.c": "--off-cpu",
    "uprobe_count.c": "count, --uprobe",
}
WARM_FIX = "sudo make setup (it runs each kind once), or any first run of the commands: they store what they compile"


def check_bpf_programs() -> CheckResult:
    """Whether the programs are stored for this kernel (bpf/programcache.py): then no compiler runs before
    the first sample. Informational: a cold cache costs a compile (about 1 s of CPU per program)."""
    from optrace.bpf.loader import stored_programs

    builds, problem = stored_programs()
    if problem:
        return CheckResult("BPF programs", False, f"never stored ({problem}): every run compiles them",
                           "give the cache directory to this user alone", required=False)
    stored = {kind: sum(n for name, n in builds.items() if kind in name.split("+")) for kind in PROGRAM_KINDS}
    missing = [f"{kind} ({PROGRAM_KINDS[kind]})" for kind, n in stored.items() if not n]
    kernel = os.uname().release
    if not missing:
        kinds = ", ".join(f"{kind} x{n}" for kind, n in stored.items())
        return CheckResult("BPF programs", True, f"warm for kernel {kernel}: stored ({kinds}; one per set of "
                           "options), loaded without a compiler", required=False)
    warm = [kind for kind, n in stored.items() if n]
    return CheckResult("BPF programs", False, f"cold for kernel {kernel}: {', '.join(missing)} not stored"
                       + (f" ({', '.join(warm)} are)" if warm else "") + ": their first run compiles (about 1 s of "
                       "CPU each)", WARM_FIX, required=False)


CHECKS: tuple[Callable[[], CheckResult], ...] = (
    check_privileges,
    check_bpf_syscall,
    check_kernel_headers,
    check_bcc,
    check_tracefs,
    check_perf_event_paranoid,
    check_btf,
    check_syscall_tracepoints,
    check_off_cpu,
    check_bpf_programs,
)


def run_checks() -> list[CheckResult]:
    return [check() for check in CHECKS]


def summary(result: CheckResult) -> str:
    """One line for an error message: what is missing and how to fix it."""
    return f"{result.detail}: {result.fix}" if result.fix else result.detail


# The checks that can stop a recording (the others only inform: the BTF one alone read 5 MB, 10-20 ms on
# the way to the first sample)
RECORDING_CHECKS = (check_privileges, check_bpf_syscall, check_kernel_headers, check_bcc, check_tracefs)


def require_recording(uprobes: bool = False) -> None:
    """Raise OptraceError for the first required check that fails (tracefs only when uprobes are used)."""
    for check in RECORDING_CHECKS:
        result = check()
        if not result.ok and result.required and (uprobes or not result.uprobes_only):
            raise OptraceError(f"cannot record: {summary(result)} (see optrace doctor)")
