"""End to end: `optrace record` names samples in JIT code from perf maps and jitdumps written by a native
program, JDK 17, Node 20 and the agent API, keeps the names after the files are deleted, and refuses
planted files without ever printing their content."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jithelpers import NOBODY, PROGRAMS, PYTHON, needs_root

OPTRACE = os.path.join(os.path.dirname(PYTHON), "optrace")

pytestmark = [pytest.mark.bpf, pytest.mark.slow]


@pytest.fixture(autouse=True)
def remove_new_perf_maps():
    """The runtimes under test leave /tmp/perf-PID.map behind: remove those of processes that are gone."""
    before = set(glob.glob("/tmp/perf-*.map"))
    yield
    for path in set(glob.glob("/tmp/perf-*.map")) - before:
        if not os.path.exists(f"/proc/{path[len('/tmp/perf-'):-len('.map')]}"):
            os.unlink(path)


def report_rows(optrace, data, sort="symbol"):
    out = optrace("report", "-i", str(data), "--format", "json", "--sort", sort, check=True).stdout
    return json.loads(out)


def share(report, needle):
    """Percent of all samples whose symbol contains ``needle``."""
    return sum(r["percent"] for r in report["rows"] if needle in r["symbol"])


def dsos(report, needle):
    return {r["dso"] for r in report["rows"] if needle in r["symbol"]}


def test_native_program_with_its_own_perf_map(optrace, jitcode_record):
    data = jitcode_record
    pid = int(json.loads(optrace("report", "-i", str(data), "--format", "json", "--sort", "pid",
                                 check=True).stdout)["rows"][0]["pid"])
    Path(f"/tmp/perf-{pid}.map").unlink(missing_ok=True)  # names were copied into the record: report needs no map
    report = report_rows(optrace, data, "dso,symbol")
    assert 55 <= share(report, "jitcode::hot loop(long)") <= 85, report
    assert 15 <= share(report, "native_burn") <= 40
    assert dsos(report, "jitcode::hot") == {f"[jit] /tmp/perf-{pid}.map"}


@pytest.fixture(scope="module")
def hot_class(tmp_path_factory):
    if not shutil.which("javac"):
        pytest.skip("JDK 17 (javac) is not installed")
    out = tmp_path_factory.mktemp("java")
    subprocess.run(["javac", "-d", str(out), str(PROGRAMS / "Hot.java")], check=True)
    return out


JAVA = ["java", "-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,Hot::hotMethod", "-cp"]


def test_java_dump_perf_map_at_exit(bpf_ready, optrace, hot_class, tmp_path):
    data = tmp_path / "java.data"
    optrace("record", "-F", "999", "-o", str(data), "--", *JAVA[:1], "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DumpPerfMapAtExit", *JAVA[1:], str(hot_class), "Hot", "3", check=True)
    report = report_rows(optrace, data)
    assert share(report, "Hot.hotMethod") > 60, report["rows"][:5]


def test_java_jcmd_perfmap_on_a_running_jvm(bpf_ready, optrace, spawn, hot_class, tmp_path):
    java = spawn([*JAVA, str(hot_class), "Hot", "15"], stdout=subprocess.PIPE, text=True)
    java.stdout.readline()
    time.sleep(1.5)  # let C2 compile hotMethod
    data = tmp_path / "jcmd.data"
    record = subprocess.Popen([str(OPTRACE), "record", "-F", "999", "-p", str(java.pid),
                               "-d", "5", "-o", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    time.sleep(2.5)  # recording is running (BPF compile ~2 s): take the snapshot now
    subprocess.run(["jcmd", str(java.pid), "Compiler.perfmap"], check=True, capture_output=True, timeout=30)
    _, err = record.communicate(timeout=60)
    assert record.returncode == 0, err
    os.unlink(f"/tmp/perf-{java.pid}.map")
    report = report_rows(optrace, data)
    assert report["meta"]["total_samples"] > 100, err
    assert share(report, "Hot.hotMethod") > 60, (err, report["meta"], report["rows"][:5])


@pytest.fixture
def node():
    if not shutil.which("node"):
        pytest.skip("node is not installed")
    return "node"


def test_node_perf_basic_prof(bpf_ready, optrace, node, tmp_path):
    data = tmp_path / "node.data"
    optrace("record", "-F", "999", "-o", str(data), "--", node, "--perf-basic-prof", str(PROGRAMS / "hot.js"), "2",
            check=True, cwd=tmp_path)
    report = report_rows(optrace, data, "dso,symbol")
    assert share(report, "hotLoop") > 60
    assert all(d.startswith("[jit] /tmp/perf-") for d in dsos(report, "hotLoop"))


def test_node_perf_prof_jitdump_only(bpf_ready, optrace, node, tmp_path):
    data = tmp_path / "node.data"
    optrace("record", "-F", "999", "-o", str(data), "--", node, "--perf-prof", str(PROGRAMS / "hot.js"), "2",
            check=True, cwd=tmp_path)  # node writes jit-PID.dump into its current directory
    dumps = list(tmp_path.glob("jit-*.dump"))
    assert len(dumps) == 1
    pid = dumps[0].name[4:-5]
    assert not os.path.exists(f"/tmp/perf-{pid}.map")  # --perf-prof writes no perf map
    dumps[0].unlink()
    report = report_rows(optrace, data, "dso,symbol")
    assert share(report, "hotLoop") > 60
    assert dsos(report, "hotLoop") == {f"[jit] {tmp_path}/jit-{pid}.dump"}


def test_address_reuse_through_the_agent(bpf_ready, optrace, tmp_path):
    """Code A runs 2.5 s at an address, then code B there: each named after the code of its drain period."""
    data = tmp_path / "reuse.data"
    rec = optrace("record", "-F", "999", "-o", str(data), "--", PYTHON, str(PROGRAMS / "reuse.py"), "2.5",
                  "--dump-dir", str(tmp_path), check=True)
    address = rec.stdout.split()[0]
    report = report_rows(optrace, data, "dso,symbol")
    a, b = share(report, "reuse_code_A"), share(report, "reuse_code_B")
    assert a >= 20 and b >= 20 and a + b >= 70, (a, b, address)


@pytest.mark.parametrize("plant", ["symlink", "other_owner"])
def test_planted_perf_map_refused_and_secret_never_printed(bpf_ready, workloads, optrace, spawn, tmp_path, plant):
    needs_root()
    secret_text = "TOPSECRET_PLANTED_4711"
    secret = tmp_path / "secret"
    secret.write_text(f"0 7fffffffffff {secret_text}\n")
    os.chmod(secret, 0o600)
    victim = spawn([str(workloads / "jitcode"), "30", "0.9", "nomap"], stdout=subprocess.PIPE, text=True)
    victim.stdout.readline()
    path = f"/tmp/perf-{victim.pid}.map"
    if plant == "symlink":
        os.symlink(secret, path)
    else:
        shutil.copy(secret, path)
        os.chown(path, NOBODY, NOBODY)
    data = tmp_path / "planted.data"
    rec = optrace("record", "-F", "499", "-p", str(victim.pid), "-d", "2", "-o", str(data), check=True)
    reason = "symbolic link" if plant == "symlink" else f"owned by uid {NOBODY}"
    outputs = {"record": rec.stdout + rec.stderr, "file": data.read_bytes().decode("latin-1")}
    for fmt in ("table", "json", "csv", "folded"):
        out = optrace("report", "-i", str(data), "--format", fmt, check=True)
        outputs[fmt] = out.stdout + out.stderr
    assert not any(secret_text in text for text in outputs.values())
    warnings = [w for w in json.loads(outputs["json"])["meta"]["warnings"] if path in w]
    assert len(warnings) == 1 and warnings[0].startswith(f"JIT symbols: {path}: ignored: it "), outputs["table"][:3000]
    assert reason in warnings[0]
    assert f"# Warning: JIT symbols: {path}: ignored" in outputs["table"]
    assert "jitcode" in outputs["table"]  # the samples are there, just not named by the planted file
