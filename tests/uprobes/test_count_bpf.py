"""Real uprobes on real processes: exact counts, sharing, filters, detaching on every exit path."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optrace.frontend.uprobes.counter import CallCounter, shared_manager

pytestmark = pytest.mark.bpf
OPTRACE = Path(sys.executable).parent / "optrace"
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")


def count_json(optrace, *args: str) -> dict:
    """stdout is the JSON document alone: the command's own output goes to stderr."""
    proc = optrace("count", "--format", "json", "--command-stdout", "stderr", *args, check=True)
    return json.loads(proc.stdout)


def probe_fds(pid: int | str = "self") -> list[str]:
    """The perf events and BPF links a process holds that can keep a uprobe alive (the counting
    program's raw tracepoint links, sched_process_fork and _exit, are left out)."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link == "anon_inode:bpf_link" and "raw_tracepoint" in Path(f"/proc/{pid}/fdinfo/{fd}").read_text():
                continue
            links.append(link)
        except OSError:
            continue
    return [link for link in links if link in ("anon_inode:[perf_event]", "anon_inode:bpf_link")]


def start_waiting(workloads: Path, n: int, libc_n: int = 0, binary: str = "calls") -> subprocess.Popen:
    """A workload that maps its binary, then waits for a line on stdin before calling anything."""
    proc = subprocess.Popen([str(workloads / binary), str(n), str(libc_n), "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while str(workloads / binary) not in Path(f"/proc/{proc.pid}/maps").read_text():  # until it has exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def release(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0 and out.startswith("done"), out


def start_counting(*args: str) -> subprocess.Popen:
    """`optrace count` in the background, returned once it says its probes are attached."""
    proc = subprocess.Popen([str(OPTRACE), "count", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stderr.readline()
    assert line.startswith("Counting calls of"), line + proc.stderr.read()
    return proc


def stop_counting(proc: subprocess.Popen, sig: int = signal.SIGINT) -> str:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return out


def uprobe_events() -> str:
    return UPROBE_EVENTS.read_text() if UPROBE_EVENTS.exists() else ""


def code_byte(pid: int, binary: str, offset: int) -> int:
    """The byte at a file offset of `binary` as mapped in process `pid` (0xcc while a uprobe is set)."""
    for line in open(f"/proc/{pid}/maps"):
        fields = line.split()
        if len(fields) == 6 and fields[5] == binary:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            file_offset = int(fields[2], 16)
            if file_offset <= offset < file_offset + end - start:
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    mem.seek(start + offset - file_offset)
                    return mem.read(1)[0]
    raise AssertionError(f"{binary} offset {offset:#x} is not mapped in {pid}")


def test_exact_counts_pie_and_non_pie(bpf_ready, workloads, optrace):
    doc = count_json(optrace, f"{workloads}/calls:target", "c:labs", "--",
                     str(workloads / "calls"), "300000", "20000")
    rows = {row["symbol"]: row for row in doc["probes"]}
    assert rows["target"]["calls"] == 300000
    assert rows["labs"]["calls"] == 20000
    assert doc["exit_status"] == 0
    nopie = count_json(optrace, f"{workloads}/calls-nopie:target", "--", str(workloads / "calls-nopie"), "50000")
    assert nopie["probes"][0]["calls"] == 50000


def test_command_children_are_counted_and_others_are_not(bpf_ready, workloads, optrace):
    """-- CMD counts the command and its descendants only, though the probe sees every process."""
    bystander = start_waiting(workloads, 3000)
    script = f"{workloads}/calls 1000 && {workloads}/calls 2000"
    doc = count_json(optrace, f"{workloads}/calls:target", "--per-pid", "--", "sh", "-c", script)
    release(bystander)
    row = doc["probes"][0]
    assert row["calls"] == 3000
    assert sorted(r["calls"] for r in row["per_pid"]) == [1000, 2000]
    assert {r["comm"] for r in row["per_pid"]} == {"calls"}


def test_libc_function_across_processes_started_after_attaching(bpf_ready, workloads):
    counting = start_counting("c:labs", "--per-pid", "--format", "json")
    pids = {}
    for libc_n in (1000, 2000, 3000):
        proc = subprocess.Popen([str(workloads / "calls"), "0", str(libc_n)], stdout=subprocess.DEVNULL)
        proc.wait(timeout=30)
        pids[proc.pid] = libc_n
    doc = json.loads(stop_counting(counting))
    per_pid = {row["pid"]: row["calls"] for row in doc["probes"][0]["per_pid"]}
    assert {pid: per_pid.get(pid) for pid in pids} == pids
    assert doc["probes"][0]["calls"] >= sum(pids.values())


def test_pid_filter(bpf_ready, workloads):
    wanted, other = start_waiting(workloads, 4000), start_waiting(workloads, 5000)
    counting = start_counting(f"{workloads}/calls:target", "-p", str(wanted.pid), "--format", "json",
                              "--per-pid")
    release(other)
    release(wanted)
    out, err = counting.communicate(timeout=30)  # stops by itself: every -p process has exited
    doc = json.loads(out)
    assert doc["probes"][0]["calls"] == 4000
    assert [(r["pid"], r["calls"]) for r in doc["probes"][0]["per_pid"]] == [(wanted.pid, 4000)]


def test_symlink_and_hard_link_are_one_attachment_and_one_count(bpf_ready, workloads, calls_links):
    link, hard = calls_links
    before = len(probe_fds())
    with CallCounter([f"{link}:target", f"{workloads}/calls:target", f"{hard}:target"]) as counter:
        assert len(counter.manager.attached_keys) == 1
        assert probe_fds().count("anon_inode:bpf_link") == 1  # each uprobe is one BPF link
        subprocess.run([str(hard), "7000"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(link), "1000"], check=True, stdout=subprocess.DEVNULL)
        assert [(c.probe, c.calls) for c in counter.calls()] == [(f"{link}:target", 8000)]
    assert len(probe_fds()) == before


def test_consumers_share_a_probe_and_keep_their_own_counts(bpf_ready, workloads):
    spec = f"{workloads}/calls:target"
    with CallCounter([spec]) as first:
        subprocess.run([str(workloads / "calls"), "1000"], check=True, stdout=subprocess.DEVNULL)
        worker = start_waiting(workloads, 300)
        second = CallCounter([spec], pid_filter=lambda pid: pid == worker.pid)
        second.start()
        assert len(shared_manager().attached_keys) == 1
        subprocess.run([str(workloads / "calls"), "20"], check=True, stdout=subprocess.DEVNULL)
        release(worker)
        assert first.calls()[0].calls == 1320
        only = second.calls()[0]
        assert (only.calls, only.per_pid) == (300, {worker.pid: 300})
        assert (second.calls()[0].calls, second.calls()[0].per_pid) == (300, {})  # listed once after its exit
        second.close()
        subprocess.run([str(workloads / "calls"), "5"], check=True, stdout=subprocess.DEVNULL)
        assert first.calls()[0].calls == 1325
    assert shared_manager().attached_keys == set()


def test_exception_inside_the_counter_detaches(bpf_ready, workloads):
    before = len(probe_fds())
    with pytest.raises(RuntimeError):
        with CallCounter([f"{workloads}/calls:target"]):
            assert len(probe_fds()) > before
            raise RuntimeError("boom")
    assert len(probe_fds()) == before
    assert shared_manager().attached_keys == set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_prints_final_counts_and_removes_the_uprobe(bpf_ready, workloads, sig):
    worker, watcher = start_waiting(workloads, 600), start_waiting(workloads, 1)
    binary = str(workloads / "calls")
    offset = CallCounter([f"{binary}:target"]).resolve().probes[0].offset
    original = code_byte(watcher.pid, binary, offset)
    assert original != 0xCC
    events_before = uprobe_events()
    counting = start_counting(f"{binary}:target", "--format", "json")
    assert code_byte(watcher.pid, binary, offset) == 0xCC  # the kernel put its breakpoint in the page
    assert probe_fds(counting.pid)
    release(worker)
    doc = json.loads(stop_counting(counting, sig))
    assert doc["probes"][0]["calls"] >= 600
    assert code_byte(watcher.pid, binary, offset) == original  # and took it out again
    release(watcher)
    assert uprobe_events() == events_before  # optrace never leaves (or makes) tracefs uprobes


def test_interval_and_duration(bpf_ready, optrace):
    proc = optrace("count", "c:labs", "-d", "1.2", "-i", "0.5", check=True)
    assert proc.stdout.count("--- ") == 3  # two intervals, then the totals
    assert proc.stdout.count("(per interval; --cumulative for running totals)") == 2
    assert proc.stdout.rstrip().splitlines()[-1].startswith("counted for 1.")


@pytest.mark.parametrize("cumulative", [False, True], ids=["per_interval", "cumulative"])
def test_intervals_count_each_burst_once(bpf_ready, optrace, workloads, cumulative, tmp_path):
    """Two bursts of 2000 calls 1.5 s apart, printed every 0.4 s: per interval (the default) no print
    holds both bursts and the prints add up to the total; --cumulative prints only grow up to it."""
    calls = workloads / "calls"
    script = f"{calls} 2000 >/dev/null; sleep 1.5; {calls} 2000 >/dev/null; sleep 0.6"
    args = ["--format", "json", f"{calls}:target", "-i", "0.4", *(["--cumulative"] if cumulative else []),
            "-o", str(tmp_path / "counts.json"), "--", "sh", "-c", script]
    optrace("count", *args, check=True)
    docs = [json.loads(line) for line in (tmp_path / "counts.json").read_text().splitlines()]
    *intervals, total = [doc["probes"][0]["calls"] for doc in docs]
    assert total == 4000 and docs[-1]["counts"] == "total"
    assert len(intervals) >= 4
    if cumulative:
        assert intervals == sorted(intervals) and intervals[-1] == 4000
        assert {doc["counts"] for doc in docs[:-1]} == {"total"}
    else:
        assert sum(intervals) == 4000 and max(intervals) <= 2000
        assert {doc["counts"] for doc in docs[:-1]} == {"interval"}


@pytest.mark.parametrize("multi", [True, False], ids=["uprobe_multi", "perf_event"])
def test_both_attach_paths_count_exactly_and_detach(bpf_ready, workloads, multi):
    """uprobe_multi links (kernel >= 6.6) and per-probe perf events (older kernels) give the same counts."""
    from optrace.bpf.uprobes import BpfUprobeAttacher
    from optrace.frontend.uprobes.manager import ProbeManager

    manager = ProbeManager(lambda: BpfUprobeAttacher(multi=multi))
    before = probe_fds()
    with CallCounter([f"{workloads}/many:fn_00*", f"{workloads}/calls:target"], manager=manager) as counter:
        assert len(counter.probes) == 11
        subprocess.run([str(workloads / "many"), "4"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(workloads / "calls"), "3000"], check=True, stdout=subprocess.DEVNULL)
        calls = [c.calls for c in counter.calls()]
    assert calls == [4] * 10 + [3000]
    assert probe_fds() == before


def test_500_function_glob(bpf_ready, workloads, optrace):
    doc = count_json(optrace, f"{workloads}/many:fn_*", "--", str(workloads / "many"), "3")
    assert len(doc["probes"]) == 500
    assert {row["calls"] for row in doc["probes"]} == {3}


def test_glob_skips_functions_the_kernel_cannot_probe(bpf_ready, optrace):
    """pthread_spin_lock starts with a lock-prefixed instruction, which x86 uprobes refuse."""
    proc = optrace("count", "c:pthread_spin_*", "-d", "0.2", check=True)
    assert "optrace: warning: skipped pthread_spin_lock" in proc.stderr
    named = optrace("count", "c:pthread_spin_lock", "-d", "0.2")
    assert named.returncode == 1 and "Traceback" not in named.stderr
    assert named.stderr.strip().splitlines()[-1].startswith("optrace: cannot set a uprobe at offset")


@pytest.mark.parametrize("name", ["demo::Hasher::mix", "demo::Hasher::mix(double)", "demo::Hasher::m*",
                                  "_ZN4demo6Hasher3mixEd"])
def test_cpp_functions_by_their_readable_names(bpf_ready, optrace, workloads, name):
    """`count` takes C++ names as `report` prints them (with or without the parameters, or a glob over
    them) as well as mangled: demo calls Hasher::mix exactly once per round, as it calls hot_a."""
    demo = workloads / "demo"
    doc = count_json(optrace, f"{demo}:{name}", f"{demo}:hot_a", "--", str(demo), "0.3")
    mix, hot_a = doc["probes"]
    assert mix["calls"] == hot_a["calls"] > 0
    assert mix["symbol"] == ("_ZN4demo6Hasher3mixEd" if name.startswith("_Z") else "demo::Hasher::mix(double)")


def test_program_name_counts_in_the_library_it_loads(bpf_ready, optrace, workloads, tmp_path):
    """`demo:lib_burn` with demo a program on PATH: lib_burn is in libburn.so, which demo loads (DT_NEEDED);
    it is counted there, once per round like hot_a, and the chosen file is said."""
    (tmp_path / "demo").symlink_to(workloads / "demo")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = optrace("count", "--format", "json", "--command-stdout", "null", "demo:lib_burn", "demo:hot_a",
                   "--", "demo", "0.3", env=env, check=True)
    lib, own = json.loads(proc.stdout.strip().splitlines()[-1])["probes"]
    assert lib["binary"] == str(workloads / "libburn.so") and lib["calls"] == own["calls"] > 0
    assert f"demo:lib_burn: {workloads / 'libburn.so'} is a library demo loads (DT_NEEDED)" in proc.stderr
