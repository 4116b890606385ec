"""`optrace doctor` and require_recording(): real checks on this machine, as root and as nobody."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optrace import kernel
from optrace.frontend import doctor
from optrace.frontend.doctor import CheckResult, format_result, require_recording
from optrace.errors import OptraceError

OPTRACE = str(Path(sys.executable).parent / "optrace")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
needs_root_and_setpriv = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                            reason="needs root and setpriv")


def test_doctor_ok_as_root(bpf_ready, optrace) -> None:
    proc = optrace("doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    names = ["privileges", "bpf syscall", "kernel headers", "BCC", "tracefs", "perf_event_paranoid", "BTF",
             "syscall tracepoints", "off-CPU"]
    assert [line.split("  ")[0].strip() for line in lines[:-1]] == ["ok"] * len(names)
    assert [line[6:28].strip() for line in lines[:-1]] == names
    assert "running as root" in lines[0]
    assert proc.stderr == ""


@needs_root_and_setpriv
def test_doctor_fails_as_nobody_naming_root_and_capabilities() -> None:
    proc = subprocess.run([*NOBODY, OPTRACE, "doctor"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "FAIL  privileges            needs root or CAP_BPF+CAP_PERFMON: fix: run with sudo" in proc.stdout
    assert "FAIL  bpf syscall" in proc.stdout and "Operation not permitted" in proc.stdout
    assert "warn  syscall tracepoints   cannot tell: tracefs is readable by root only" in proc.stdout
    stderr = proc.stderr.splitlines()
    assert len(stderr) == 1 and "needs root or CAP_BPF+CAP_PERFMON: run with sudo" in stderr[0]
    assert "Traceback" not in proc.stderr


@needs_root_and_setpriv
def test_capabilities_without_root_are_enough(bpf_ready) -> None:
    caps = ["--inh-caps=+bpf,+perfmon", "--ambient-caps=+bpf,+perfmon"]
    proc = subprocess.run([*NOBODY, *caps, OPTRACE, "doctor"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not root, but has CAP_BPF + CAP_PERFMON" in proc.stdout
    assert "ok    bpf syscall" in proc.stdout


@needs_root_and_setpriv
def test_require_recording_as_nobody_is_one_line() -> None:
    code = "from optrace.frontend.doctor import require_recording\nrequire_recording()\n"
    proc = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "OptraceError: cannot record: needs root or CAP_BPF+CAP_PERFMON: run with sudo" in proc.stderr


def test_require_recording_passes_here_as_root(bpf_ready) -> None:
    require_recording()
    require_recording(uprobes=True)


def test_missing_tracefs_fails_only_for_uprobes(bpf_ready, monkeypatch) -> None:
    monkeypatch.setattr(kernel, "tracefs_mount_points", lambda: [])
    result = doctor.check_tracefs()
    assert result.status == "FAIL"
    assert format_result(result).endswith("fix: sudo mount -t tracefs nodev /sys/kernel/tracing")
    require_recording()
    with pytest.raises(OptraceError, match="mount -t tracefs nodev /sys/kernel/tracing"):
        require_recording(uprobes=True)


def test_missing_bcc_names_the_debian_package(monkeypatch) -> None:
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    result = doctor.check_bcc()
    assert (result.status, result.fix) == ("FAIL", "sudo apt-get install python3-bpfcc")


def test_pypi_bcc_is_not_bcc(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "bcc").mkdir()
    (tmp_path / "bcc" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bcc", raising=False)
    result = doctor.check_bcc()
    assert result.status == "FAIL" and "PyPI's bcc is another project" in result.detail


def test_informational_checks_never_fail_doctor() -> None:
    result = CheckResult("BTF", False, "missing", "rebuild", required=False)
    assert result.status == "warn"
    assert doctor.check_perf_event_paranoid().required is False


def test_without_syscall_tracepoints_doctor_warns_and_the_profiler_keeps_build_id_stacks(monkeypatch) -> None:
    from optrace.bpf import profiler

    monkeypatch.setattr(kernel, "TRACEFS_DIRS", ("/nonexistent",))
    result = doctor.check_syscall_tracepoints()
    assert (result.status, result.required) == ("warn", False) and "CONFIG_FTRACE_SYSCALLS" in result.fix
    monkeypatch.setattr(profiler, "syscall_events_available", lambda: False)
    sampler = profiler.Profiler(99)
    assert not sampler.raw_stacks and "-DRAW_STACKS" not in sampler._cflags


def test_tracefs_mount_points_reads_proc_mounts() -> None:
    mounts = Path("/proc/self/mounts").read_text()
    expected = " /sys/kernel/tracing tracefs " in mounts or " /sys/kernel/debug/tracing tracefs " in mounts
    assert bool(kernel.tracefs_mount_points()) == expected
