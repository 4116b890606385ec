"""`optrace doctor` and require_recording(): real checks on this machine, as root and as nobody."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optrace import kernel
from optrace.frontend import preflight
from optrace.frontend.commands.doctor import format_result
from optrace.frontend.preflight import CheckResult, require_recording
from optrace.frontend.runtimes.cpython.survey import check_python
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
             "syscall tracepoints", "off-CPU", "BPF programs", "python"]
    headers = preflight.check_kernel_headers()  # warn on this VM: Debian's 6.1 headers for a 6.18 kernel
    assert headers.status in ("ok", "warn")
    programs = preflight.check_bpf_programs()  # warn until the suite has loaded each kind (its own cache)
    python = check_python()  # warn while a process runs an interpreter the walker does not know
    expected = [{"kernel headers": headers.status, "BPF programs": programs.status, "python": python.status}.get(name, "ok")
                for name in names]
    assert [line.split("  ")[0].strip() for line in lines[:-1]] == expected
    assert [line[6:28].strip() for line in lines[:-1]] == names
    assert "running as root" in lines[0]
    assert proc.stderr == ""


def test_doctor_says_whether_the_programs_are_stored_for_this_kernel(bpf_ready, fresh_program_cache, monkeypatch):
    from optrace.bpf import programcache
    from optrace.bpf.offcpu import WaitOptions
    from optrace.bpf.profiler import Profiler
    from optrace.bpf.uprobes import BpfUprobeAttacher

    cold = preflight.check_bpf_programs()
    assert cold.status == "warn" and not cold.required
    assert "cold for kernel" in cold.detail and all(kind in cold.detail for kind in preflight.PROGRAM_KINDS)
    for program in (Profiler(99, pids=[], cfi_unwind=True), Profiler(99, pids=[], waits=WaitOptions())):
        program.load()
        program.close()
    assert preflight.check_bpf_programs().detail.endswith("uprobe_count.c (count, --uprobe) not stored (profile.c, "
                                                       "offcpu.c are): their first run compiles (about 1 s of CPU each)")
    BpfUprobeAttacher().close()
    warm = preflight.check_bpf_programs()
    assert warm.ok and warm.detail.startswith(f"warm for kernel {os.uname().release}: stored (profile.c x2, offcpu.c x1, ")  # CPU alone, CPU with waits
    real = programcache.kernel_identity()
    monkeypatch.setattr(programcache, "kernel_identity", lambda: {**real, "release": "6.1.0-other"})
    assert preflight.check_bpf_programs().status == "warn"  # another kernel's run finds none of these


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
    code = "from optrace.frontend.preflight import require_recording\nrequire_recording()\n"
    proc = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "OptraceError: cannot record: needs root or CAP_BPF+CAP_PERFMON: run with sudo" in proc.stderr


def test_require_recording_passes_here_as_root(bpf_ready) -> None:
    require_recording()
    require_recording(uprobes=True)


def test_missing_tracefs_fails_only_for_uprobes(bpf_ready, monkeypatch) -> None:
    monkeypatch.setattr(kernel, "tracefs_mount_points", lambda: [])
    result = preflight.check_tracefs()
    assert result.status == "FAIL"
    assert format_result(result).endswith("fix: sudo mount -t tracefs nodev /sys/kernel/tracing")
    require_recording()
    with pytest.raises(OptraceError, match="mount -t tracefs nodev /sys/kernel/tracing"):
        require_recording(uprobes=True)


def test_missing_bcc_names_the_debian_package(monkeypatch) -> None:
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name: None)
    result = preflight.check_bcc()
    assert (result.status, result.fix) == ("FAIL", "sudo apt-get install python3-bpfcc")


def test_pypi_bcc_is_not_bcc(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "bcc").mkdir()
    (tmp_path / "bcc" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bcc", raising=False)
    result = preflight.check_bcc()
    assert result.status == "FAIL" and "PyPI's bcc is another project" in result.detail


def test_informational_checks_never_fail_doctor() -> None:
    result = CheckResult("BTF", False, "missing", "rebuild", required=False)
    assert result.status == "warn"
    assert preflight.check_perf_event_paranoid().required is False


def test_without_syscall_tracepoints_doctor_warns_and_the_profiler_keeps_build_id_stacks(monkeypatch) -> None:
    from optrace.bpf import profiler

    monkeypatch.setattr(kernel, "TRACEFS_DIRS", ("/nonexistent",))
    result = preflight.check_syscall_tracepoints()
    assert (result.status, result.required) == ("warn", False) and "CONFIG_FTRACE_SYSCALLS" in result.fix
    monkeypatch.setattr(profiler, "syscall_events_available", lambda: False)
    sampler = profiler.Profiler(99)
    assert not sampler.raw_stacks and "-DRAW_STACKS" not in sampler._cflags


def test_tracefs_mount_points_reads_proc_mounts() -> None:
    mounts = Path("/proc/self/mounts").read_text()
    expected = " /sys/kernel/tracing tracefs " in mounts or " /sys/kernel/debug/tracing tracefs " in mounts
    assert bool(kernel.tracefs_mount_points()) == expected


def _header_tree(modules: Path, headers_release: str) -> None:
    generated = modules / os.uname().release / "build" / "include" / "generated"
    generated.mkdir(parents=True)
    (generated / "utsrelease.h").write_text(f'#define UTS_RELEASE "{headers_release}"\n')


def test_mismatched_kernel_headers_are_a_warning_with_the_risk_and_the_fix(tmp_path) -> None:
    _header_tree(tmp_path, "6.1.0-57-amd64")
    result = preflight.check_kernel_headers(str(tmp_path))
    if os.uname().release.startswith("6.1."):
        pytest.skip("this kernel is a 6.1 one")
    assert result.status == "warn" and not result.required
    assert f"holds 6.1.0-57-amd64 headers for kernel {os.uname().release}" in result.detail
    assert "offsets from the kernel's BTF" in result.detail
    assert f"linux-headers-{os.uname().release}" in result.fix and "CONFIG_IKHEADERS" in result.fix


def test_btf_gives_the_raw_tracepoints_their_offsets_or_a_warning_says_what_depends_on_it(monkeypatch) -> None:
    from optrace.bpf import btf

    assert preflight.check_btf().status == "ok"  # this kernel has BTF (NOTES)
    monkeypatch.setattr(btf, "kernel_offsets", lambda: None)
    result = preflight.check_btf()
    assert (result.status, result.required) == ("warn", False)
    assert "headers' offsets" in result.detail and "CONFIG_DEBUG_INFO_BTF" in result.fix


def test_matching_kernel_headers_are_ok(tmp_path) -> None:
    _header_tree(tmp_path, os.uname().release)
    assert preflight.check_kernel_headers(str(tmp_path)).status == "ok"


def test_the_real_headers_status_follows_their_version() -> None:
    """This machine: whatever /lib/modules/$(uname -r)/build holds, ok exactly when its version matches."""
    build = Path(f"/lib/modules/{os.uname().release}/build/include")
    if not build.is_dir():
        pytest.skip("no kernel headers linked here")
    release = preflight.headers_release(build)
    same = release is None or release.split(".")[:2] == os.uname().release.split(".")[:2]
    assert preflight.check_kernel_headers().ok == same


def test_venv_without_system_site_packages_is_told_to_recreate_it(tmp_path) -> None:
    """A venv made without --system-site-packages cannot import Debian's BCC: doctor says to recreate the
    venv with --system-site-packages, not to reinstall python3-bpfcc (which is installed)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    import sysconfig

    ours = sysconfig.get_paths()["purelib"]  # optrace's editable install, added as a site dir (.pth files)
    code = (f"import site; site.addsitedir({ours!r})\n"
            "from optrace.frontend.commands.doctor import format_result\n"
            "from optrace.frontend.preflight import check_bcc\nprint(format_result(check_bcc()))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("FAIL  BCC"), proc.stdout
    assert f"fix: recreate it: /usr/bin/python3 -m venv --system-site-packages {venv}" in proc.stdout
    assert "apt-get install" not in proc.stdout


def test_without_btf_the_syscall_tracepoints_are_not_used(monkeypatch) -> None:
    """Their programs read the call's arguments through bpf_get_current_task_btf: no BTF, no load."""
    assert kernel.syscall_events_available()
    monkeypatch.setattr(kernel, "VMLINUX_BTF", "/nonexistent")
    assert not kernel.syscall_events_available()
    assert "CONFIG_DEBUG_INFO_BTF" in preflight.check_syscall_tracepoints().fix
