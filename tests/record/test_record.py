"""optrace record + report end to end, on workloads with known CPU shares (real BPF, needs root)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import OPTRACE, assert_no_programs_of, assert_one_line_error, run_as_nobody, run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")


def record(tmp_path: Path, *args: str, name: str = "rec.data") -> Path:
    out = tmp_path / name
    proc = run_optrace("record", "-o", str(out), *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return out


def report_json(path: Path, *args: str) -> dict:
    proc = run_optrace("report", "-i", str(path), "--format", "json", *args, check=True)
    return json.loads(proc.stdout)


def share(rows: list[dict], symbol: str) -> float:
    return sum(r["percent"] for r in rows if r["symbol"] == symbol)


def test_demo_shares_match_design(demo_record):
    """hot_a 40%, hot_b 20%, lib_burn (shared library) 20%, the C++ method 20%: each within 5 points (the
    shared `record -F 999 -- demo 3`)."""
    data = demo_record
    rows = report_json(data, "--comm", "demo")["rows"]
    assert share(rows, "hot_a") == pytest.approx(40, abs=5)
    assert share(rows, "hot_b") == pytest.approx(20, abs=5)
    assert share(rows, "lib_burn") == pytest.approx(20, abs=5)
    assert share(rows, "demo::Hasher::mix(double)") == pytest.approx(20, abs=5)
    lib_rows = [r for r in rows if r["symbol"] == "lib_burn"]
    assert {os.path.basename(r["dso"]) for r in lib_rows} == {"libburn.so"}
    kinds = report_json(data)["meta"]["user_stacks"]  # build-ids only until the exec is seen (50 ms)
    walked = kinds.get("raw", 0) + kinds.get("cfi", 0)  # raw IPs (--call-graph fp) or unwound from CFI
    assert walked > 0.9 * (walked + kinds.get("build_id", 0)), kinds


@pytest.mark.parametrize("call_graph,kind", [("fp", "raw"), ("dwarf", "cfi")])
def test_library_loaded_mid_run_is_named(tmp_path, workloads, call_graph, kind):
    """The sampler takes raw IPs (fp) or unwinds from CFI (dwarf) once it has read a process's mappings;
    a dlopen after that must be seen (the mmap changes the process's epoch), or lib_burn's samples would
    be unnamed addresses."""
    data = record(tmp_path, "-F", "499", "--call-graph", call_graph, "--", str(workloads / "dlopen-late"),
                  str(workloads / "libburn.so"), "1.5", "1.5")
    report = report_json(data, "--comm", "dlopen-late")
    rows = report["rows"]
    assert share(rows, "before_dlopen") == pytest.approx(50, abs=8)
    assert share(rows, "lib_burn") == pytest.approx(50, abs=8)
    assert report["meta"]["user_stacks"][kind] > 0


def test_non_pie_binary(tmp_path, workloads):
    data = record(tmp_path, "-F", "499", "--", str(workloads / "demo-nopie"), "1.5")
    rows = report_json(data)["rows"]
    assert share(rows, "hot_a") == pytest.approx(40, abs=7)


def test_record_meta_and_exit_status(tmp_path, workloads):
    out = tmp_path / "rec.data"
    proc = run_optrace("record", "-o", str(out), "-F", "99", "--", "sh", "-c", "exit 3")
    assert proc.returncode == 3, proc.stderr  # the command's status, like perf record and optrace count
    assert "exit status 3" in proc.stderr
    meta = report_json(out)["meta"]
    assert meta["exit_status"] == 3
    assert meta["frequency_hz"] == 99
    assert meta["event"] == "cpu-clock"


def test_record_exit_status_of_a_signalled_command_and_of_a_stopped_one(tmp_path):
    """Killed by SIGTERM: 128+15, as a shell says. Stopped by -d (the recording ended first): 0."""
    out = tmp_path / "rec.data"
    proc = run_optrace("record", "-o", str(out), "--", "sh", "-c", "kill -TERM $$")
    assert proc.returncode == 143, proc.stderr
    assert "killed by SIGTERM" in proc.stderr
    proc = run_optrace("record", "-o", str(out), "-d", "1", "--", "sleep", "30")
    assert proc.returncode == 0, proc.stderr
    assert "command was sent SIGTERM" in proc.stderr


def test_kernel_functions_on_syscall_heavy_run(tmp_path, workloads):
    data = record(tmp_path, "-F", "999", "--", str(workloads / "syscalls"), "1.5")
    rows = report_json(data)["rows"]
    kernel = [r for r in rows if r["dso"] == "[kernel.kallsyms]"]
    assert sum(r["percent"] for r in kernel) > 50
    kallsyms = {line.split()[2] for line in Path("/proc/kallsyms").read_text().splitlines()}
    top = max(kernel, key=lambda r: r["samples"])
    assert top["symbol"] in kallsyms
    table = run_optrace("report", "-i", str(data), check=True).stdout
    assert "[k]" in table and "[.]" in table


def test_short_lived_processes_are_named(tmp_path, workloads):
    """60 processes that exit long before the recording ends: build-id stacks still name them."""
    loop = f"for i in $(seq 60); do {workloads / 'shortlived'} 25; done"
    data = record(tmp_path, "-F", "999", "--", "sh", "-c", loop)
    report = report_json(data, "--comm", "shortlived", "--sort", "pid,symbol")
    rows = report["rows"]
    assert len({r["pid"] for r in rows}) >= 50
    named = sum(r["samples"] for r in rows if r["symbol"] == "short_burn")
    total = sum(r["samples"] for r in rows)
    assert named / total > 0.85


def test_stripped_binary_named_through_build_id_debug_file(tmp_path, workloads):
    binary = tmp_path / "stripped"
    debug = tmp_path / "stripped.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(workloads / "shortlived"), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", "-o", str(binary), str(workloads / "shortlived")], check=True)
    nm = subprocess.run(["nm", str(binary)], capture_output=True, text=True)
    assert "short_burn" not in nm.stdout
    build_id = subprocess.run(
        ["readelf", "-n", str(binary)], capture_output=True, text=True, check=True
    ).stdout.split("Build ID: ")[1].split()[0]
    target = Path("/usr/lib/debug/.build-id") / build_id[:2] / f"{build_id[2:]}.debug"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(debug.read_bytes())
    try:
        data = record(tmp_path, "-F", "999", "--", str(binary), "500")
    finally:
        target.unlink()
    rows = report_json(data, "--comm", "stripped")["rows"]
    assert share(rows, "short_burn") > 85


def test_attach_to_running_process(tmp_path, workloads):
    proc = subprocess.Popen([str(workloads / "demo"), "20"])
    try:
        time.sleep(0.3)
        data = record(tmp_path, "-F", "499", "-p", str(proc.pid), "-d", "2")
    finally:
        proc.kill()
        proc.wait()
    report = report_json(data)
    assert {r["pid"] for r in report_json(data, "--sort", "pid")["rows"]} == {proc.pid}
    assert share(report["rows"], "hot_a") == pytest.approx(40, abs=8)
    kinds = report["meta"]["user_stacks"]  # the process's maps are read at start: walked throughout
    assert kinds.get("build_id", 0) <= 0.02 * (kinds.get("raw", 0) + kinds.get("cfi", 0)), kinds


def test_system_wide(tmp_path, workloads):
    proc = subprocess.Popen([str(workloads / "demo"), "20"])
    try:
        data = record(tmp_path, "-F", "199", "-a", "-d", "2")
    finally:
        proc.kill()
        proc.wait()
    rows = report_json(data, "--comm", "demo")["rows"]
    demo_total = sum(r["percent"] for r in rows)
    assert share(rows, "hot_a") / demo_total == pytest.approx(0.40, abs=0.08)


def test_system_wide_with_a_command_says_whole_machine(tmp_path, workloads):
    data = record(tmp_path, "-F", "199", "-a", "--", str(workloads / "demo"), "1")
    text = run_optrace("report", "-i", str(data), check=True).stdout
    assert f"# Target: whole machine, while running command {workloads / 'demo'} 1 (exit status 0)" in text
    doc = report_json(data, "--sort", "comm")
    assert doc["meta"]["system_wide"] and "launcher_samples" in doc["meta"]
    assert "optrace-exec" not in {row["comm"] for row in doc["rows"]}  # left out, counted in launcher_samples
    assert "demo" in {row["comm"] for row in doc["rows"]}


def test_no_stacks_keeps_only_the_leaf(tmp_path, workloads):
    """Without stacks inclusive time is self time; with them, main is on (nearly) every stack."""
    data = record(tmp_path, "-F", "499", "--no-stacks", "--", str(workloads / "demo"), "1")
    rows = report_json(data, "--children")["rows"]
    assert rows and all(r["children"] == r["samples"] for r in rows)
    with_stacks = record(tmp_path, "-F", "499", "--", str(workloads / "demo"), "1", name="g.data")
    assert max(r["children_percent"] for r in report_json(with_stacks, "--children")["rows"] if r["symbol"] == "main") > 90


def test_lost_stacks_are_counted_and_reported(tmp_path, workloads):
    """A tiny stack store fills up between two drains. Every sample shown as [unknown] is counted in the
    lost line (each sample once); the only counted ones not [unknown] are kernel-mode samples that kept one
    of their two stacks. More than 1 % lost: a warning names the flag."""
    # 262,144 possible stacks: nearly every sample's is new, and a store of 2 holds a few hundred
    data = record(tmp_path, "-F", "999", "--stack-storage-size", "2", "--", str(workloads / "stacks"), "1.5")
    report = report_json(data)
    meta = report["meta"]
    lost_user_stacks = {k: n for k, n in meta["lost"].items() if k.startswith("user_stack")}
    assert sum(lost_user_stacks.values()) > 0
    stackless = sum(n for k, n in meta["lost"].items() if "stack" in k)
    unknown = sum(r["samples"] for r in report["rows"] if r["symbol"] == "[unknown]")
    in_kernel = sum(r["samples"] for r in report["rows"] if r["kernel"])
    # a kernel-mode sample that lost its kernel stack but kept its user stack shows its user frames
    kernel_lost = sum(n for k, n in meta["lost"].items() if k.startswith("kernel_stack"))
    assert unknown <= stackless <= unknown + in_kernel + kernel_lost, (unknown, in_kernel, meta["lost"])
    table = run_optrace("report", "-i", str(data), check=True).stdout
    assert f"samples without their stack: {stackless} (" in table
    for reason in lost_user_stacks:
        assert reason in table
    share = 100 * stackless / meta["total_samples"]
    assert f"# Warning: {share:.1f}% of samples lost their stack (a stack store of 2 stacks): " \
           "record with --stack-storage-size 8192" in table.splitlines()


def test_frequency_above_the_kernel_cap_is_refused_in_one_line(tmp_path):
    cap = int(Path("/proc/sys/kernel/perf_event_max_sample_rate").read_text())
    proc = run_optrace("record", "-o", str(tmp_path / "x.data"), "-F", str(cap + 1), "--", "true")
    assert_one_line_error(proc, f"frequency {cap + 1} Hz is above kernel.perf_event_max_sample_rate ({cap}): "
                                f"use -F {cap} or less, or raise the cap with sysctl -w "
                                f"kernel.perf_event_max_sample_rate={cap + 1}")
    assert not (tmp_path / "x.data").exists()


def test_file_owned_by_sudo_user(tmp_path, workloads):
    out = tmp_path / "owned.data"
    env = {**os.environ, "SUDO_UID": "65534", "SUDO_GID": "65534"}
    proc = run_optrace("record", "-o", str(out), "--", "true", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (out.stat().st_uid, out.stat().st_gid) == (65534, 65534)


def test_unprivileged_user_reports_a_root_record(tmp_path, workloads):
    shared = Path(tempfile.mkdtemp(prefix="optrace-test-"))
    try:
        data = record(shared, "-F", "499", "--", str(workloads / "demo"), "1")
        os.chmod(shared, 0o755)
        os.chmod(data, 0o644)
        proc = run_as_nobody(str(OPTRACE), "report", "-i", str(data))
    finally:
        shutil.rmtree(shared)
    assert proc.returncode == 0, proc.stderr
    assert "hot_a" in proc.stdout


def wait_for_child(pid: int, comm: str, timeout: float = 60) -> int:
    """The recorder is past BPF set-up once its command runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().strip() == comm:
                return int(child)
        time.sleep(0.1)
    raise AssertionError(f"{comm} never started under {pid}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_record_leaves_a_reportable_file(tmp_path, workloads, sig):
    out = tmp_path / "sig.data"
    proc = subprocess.Popen(
        [str(OPTRACE), "record", "-F", "499", "-o", str(out), "--", str(workloads / "demo"), "60"],
        stderr=subprocess.PIPE, text=True,
    )
    wait_for_child(proc.pid, "demo")
    time.sleep(2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    report = report_json(out)
    assert report["meta"]["total_samples"] > 100
    assert share(report["rows"], "hot_a") == pytest.approx(40, abs=8)
    assert not list(tmp_path.glob(".*sig.data*")), "temporary file left behind"
    assert_no_programs_of(proc.pid, "on_sample")


def test_bad_inputs(tmp_path):
    out = str(tmp_path / "x.data")
    assert_one_line_error(run_optrace("record", "-o", out, "-p", "999999999"), "no such process")
    assert_one_line_error(run_optrace("record", "-o", out, "--", "no-such-cmd-xyz"), "command not found")
    assert_one_line_error(run_optrace("record", "-o", out), "nothing to record")
    assert_one_line_error(run_optrace("record", "-o", out, "-F", "0", "-a"), "frequency")
    assert_one_line_error(run_optrace("record", "-o", out, "-p", "abc"), "not a process id")
    assert not Path(out).exists()


def test_not_root_fails_early_with_advice(tmp_path):
    proc = run_as_nobody(str(OPTRACE), "record", "-o", str(tmp_path / "x.data"), "--", "true")
    assert_one_line_error(proc, "root")


def test_pid_recording_ends_when_the_process_exits(tmp_path, workloads):
    proc = subprocess.Popen([str(workloads / "demo"), "4"])
    try:
        data = record(tmp_path, "-F", "499", "-p", str(proc.pid), "-d", "120")
    finally:
        proc.kill()
        proc.wait()
    meta = report_json(data)["meta"]
    assert meta["duration_s"] < 60
    assert meta["total_samples"] > 0


def test_threads_are_recorded(tmp_path, workloads):
    """Two threads, each burning 1 s of its own CPU time (burn.h's deadline: equal by construction) in its own
    function: `--sort tid` tells them apart, each function has exactly its thread's id (the main thread's tid
    is the pid), and each thread has about half of the samples. Run as SCHED_FIFO, the two threads run side by
    side on the two CPUs unpreempted, their 1 ms ticks in strict turn, and at -F 500 a period is two ticks:
    samples at fixed points of the process's time took every tick of one thread (99.7 % / 0.3 %; a CI run
    under load at -F 499 had 68 % / 32 %), profile.c's thresholds at random points in each period do not."""
    out = tmp_path / "rec.data"
    proc = run_optrace("record", "-o", str(out), "-F", "500", "--", "chrt", "-f", "1", str(workloads / "threads"),
                       "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = report_json(out, "--sort", "pid,tid,symbol", "--comm", "threads")
    tids = {}
    for row in doc["rows"]:
        if row["symbol"] in ("main_work", "worker_work"):
            tids.setdefault(row["symbol"], set()).add((row["pid"], row["tid"]))
    [(main_pid, main_tid)] = tids["main_work"]
    [(worker_pid, worker_tid)] = tids["worker_work"]
    assert main_pid == worker_pid == main_tid != worker_tid
    assert doc["meta"]["total_samples"] > 800  # 2 s of CPU at 500 Hz: about 1000
    by_tid = {r["tid"]: r["percent"] for r in report_json(out, "--sort", "tid", "--comm", "threads")["rows"]}
    assert by_tid[main_tid] == pytest.approx(by_tid[worker_tid], abs=12)  # 1000 samples: 3.8 sigma


@pytest.mark.skipif(shutil.which("java") is None, reason="needs java")
def test_java_through_its_symlinks_records_without_a_missing_library_warning(tmp_path):
    """`record -- java -version`: java is /usr/bin/java -> /etc/alternatives -> /usr/lib/jvm/...; its
    libjli.so is found through $ORIGIN of the real path, so no 'not found' warning is stored."""
    out = tmp_path / "rec.data"
    proc = run_optrace("record", "-o", str(out), "--", "java", "-version", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "not found" not in proc.stderr
    assert not [w for w in report_json(out)["meta"]["warnings"] if "not found" in w]
