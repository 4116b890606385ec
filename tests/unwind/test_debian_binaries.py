"""Debian's own binaries, unmodified and built without frame pointers (xz with liblzma, python3.11, gcc's
cc1): the CFI unwinder gives >= 95 % complete stacks, and the top inclusive rows match perf record
--call-graph dwarf (perf copies the stack per sample and unwinds with libdw afterwards) within 3 points.
Python's shares move by up to 10 points from one run to the next on a loaded machine (perf's own, run
after run), so there both tools sample the same run."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support import OPTRACE, run_optrace, wait_perf_events

pytestmark = pytest.mark.usefixtures("bpf_ready")

HZ = "199"  # perf.data of cc1 with 64 KiB stacks: about 100 MB
PERF_ROW = re.compile(r"^\s+([0-9.]+)%\s+([0-9.]+)%\s+\[[.k]\]\s+(.+?)\s*$")
TOP_SHARE = 10.0  # perf rows with at least this inclusive share are compared
PYTHON_LOOP = """
import os, sys, time
while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
def hot(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s
def caller(rounds):
    t = 0
    for _ in range(rounds):
        t += hot(200000)
    return t
caller(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def perf() -> str:
    found = shutil.which("perf")
    assert found, "perf (linux-perf) is installed by make setup"
    return found


def optrace_children(tmp_path: Path, command: list[str]) -> tuple[dict[str, float], dict]:
    out = tmp_path / "optrace.data"
    proc = run_optrace("record", "-F", HZ, "-o", str(out), "--", *command, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return children_of(out)


def children_of(record: Path) -> tuple[dict[str, float], dict]:
    """User-space inclusive shares by symbol name, and the record's meta."""
    report = json.loads(run_optrace("report", "-i", str(record), "--format", "json", "--children",
                                    check=True).stdout)
    children: dict[str, float] = {}
    for row in report["rows"]:
        if not row["kernel"]:
            children[row["symbol"]] = children.get(row["symbol"], 0.0) + row["children_percent"]
    return children, report["meta"]


def perf_children(tmp_path: Path, perf: str, command: list[str]) -> dict[str, float]:
    """perf copies 64 KiB of stack per sample (its most: the default 8 KiB cuts cc1's deep stacks, 93 %
    of them reach main)."""
    data = tmp_path / "perf.data"
    subprocess.run([perf, "record", "-q", "--call-graph", "dwarf,65528", "-F", HZ, "-o", str(data), "--", *command],
                   check=True, capture_output=True, timeout=600)
    return perf_report_children(perf, data)


def perf_report_children(perf: str, data: Path) -> dict[str, float]:
    text = subprocess.run([perf, "report", "-i", str(data), "--children", "--stdio", "-g", "none", "--sort", "sym",
                           "--percent-limit", "1"], check=True, capture_output=True, text=True, timeout=600).stdout
    children: dict[str, float] = {}
    for line in text.splitlines():
        match = PERF_ROW.match(line)
        if match and "[k]" not in line:
            children[match.group(3)] = children.get(match.group(3), 0.0) + float(match.group(1))
    return children


def both_on_one_run(tmp_path: Path, perf: str, command: list[str], go: Path, hz: str
                    ) -> tuple[dict[str, float], dict, dict[str, float]]:
    """optrace record -p and perf record -p on the same process, which starts its work once ``go``
    exists: both attached (perf events open) and one more second for optrace's unwind tables."""
    record, data = tmp_path / "optrace.data", tmp_path / "perf.data"
    work = subprocess.Popen(command)
    # --python off: the interpreter's own frames, as perf shows them (its Python frames: tests/python/)
    tools = [subprocess.Popen([str(OPTRACE), "record", "--python", "off", "-F", hz, "-o", str(record), "-p",
                               str(work.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
             subprocess.Popen([perf, "record", "-q", "--call-graph", "dwarf,8192", "-F", hz, "-o", str(data),
                               "-p", str(work.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)]
    try:
        wait_perf_events(tools[0].pid, 2 * os.cpu_count())
        wait_perf_events(tools[1].pid, os.cpu_count())
        time.sleep(1)
        go.touch()
        assert work.wait(timeout=300) == 0
        for tool in tools:
            _, err = tool.communicate(timeout=120)
            assert tool.returncode == 0, err
    finally:
        for proc in (work, *tools):
            proc.kill()
            proc.wait()
    return (*children_of(record), perf_report_children(perf, data))


def each_on_its_own_run(tmp_path: Path, perf: str, commands: tuple[list[str], list[str]]
                        ) -> tuple[dict[str, float], dict, dict[str, float]]:
    """optrace records the first command and perf the second, at the same time (the machine has two CPUs):
    two runs of the same work, each tool on its own, in the wall time of one. Shares are of each run's own
    samples, so the other run costs neither tool anything but time."""
    with ThreadPoolExecutor(2) as pool:
        ours = pool.submit(optrace_children, tmp_path, commands[0])
        theirs = pool.submit(perf_children, tmp_path, perf, commands[1])
        return (*ours.result(), theirs.result())


def compare_with_perf(tmp_path: Path, perf: str, commands: tuple[list[str], list[str]], named: int = 3) -> None:
    assert_like_perf(*each_on_its_own_run(tmp_path, perf, commands), named)


def assert_like_perf(ours: dict[str, float], meta: dict, theirs: dict[str, float], named: int = 3) -> None:
    """Rows perf shows at >= TOP_SHARE inclusive, by symbol name: at least ``named`` of them are named by
    both tools (stripped code is an address in both, written differently), each within 3 points."""
    quality = meta["stack_quality"]
    assert quality.get("complete", 0) >= 0.95 * sum(quality.values()), quality
    top = {name: share for name, share in theirs.items() if share >= TOP_SHARE and name in ours}
    assert len(top) >= named, (theirs, sorted(ours.items(), key=lambda item: -item[1])[:20])
    far = {name: (ours[name], share) for name, share in top.items() if abs(ours[name] - share) > 3}
    assert not far, far


def test_xz(tmp_path, perf):
    """xz -6 of 6 MB of text (liblzma's match finder and encoder: deep, frame-pointer-less stacks). xz and
    liblzma are stripped: the rows both tools name are lzma_code and __libc_start_call_main."""
    words = [f"w{i:x}" for i in range(4000)]
    rng = random.Random(1)
    text = " ".join(rng.choice(words) for _ in range(1_200_000)).encode()
    sources = tmp_path / "optrace-input.txt", tmp_path / "perf-input.txt"  # each run writes its own .xz
    for source in sources:
        source.write_bytes(text)
    compare_with_perf(tmp_path, perf, tuple(["xz", "-T1", "-6", "-k", "-f", str(source)] for source in sources),
                      named=2)


def test_python311(tmp_path, perf):
    """Both tools at 999 Hz on one 6 s run: about 6,400 samples each, so a 3-point gap between two
    sampled shares near 40 % is over 7 standard errors, never chance (measured gaps: 0.2-0.6 points)."""
    script, go = tmp_path / "loop.py", tmp_path / "go"
    script.write_text(PYTHON_LOOP)
    ours, meta, theirs = both_on_one_run(tmp_path, perf, ["/usr/bin/python3.11", str(script), "1000", str(go)],
                                         go, "999")
    assert_like_perf(ours, meta, theirs)
    assert sum(meta["stack_quality"].values()) >= 4000, meta["stack_quality"]


def test_cc1(tmp_path, perf):
    """gcc -O2 on 1,000 generated functions. A small file is compiled first, as in a build: the first cc1
    of a session is walked by frame pointers while its table (478,579 rows, 1-3 s on this loaded machine)
    is built, which goes on after that cc1 exited; the pause lets it finish, and the next cc1 starts with
    the table ready."""
    small = tmp_path / "small.c"
    small.write_text("int one(void) { return 1; }\n")
    big = tmp_path / "big.c"
    big.write_text(generated_c(1000))
    scripts = [f"gcc -c {small} -o {tmp_path}/{tool}-small.o && sleep 5 && gcc -O2 -c {big} -o {tmp_path}/{tool}-big.o"
               for tool in ("optrace", "perf")]  # each run writes its own objects
    # cc1 is stripped, so perf names only main and __libc_start_call_main, and perf's own dwarf unwinding
    # leaves 6-9 % of cc1's stacks short of them (seen in clean-clone CI runs: perf 91.6 %, optrace 98.2 %):
    # perf is no 3-point reference here. optrace's stacks must be complete and reach main at least as
    # often as perf's.
    ours, meta, theirs = each_on_its_own_run(tmp_path, perf, (["sh", "-c", scripts[0]], ["sh", "-c", scripts[1]]))
    quality = meta["stack_quality"]
    assert quality.get("complete", 0) >= 0.95 * sum(quality.values()), quality
    assert ours.get("main", 0) >= 95, sorted(ours.items(), key=lambda item: -item[1])[:10]
    assert ours["main"] >= theirs.get("main", 0) - 3, (ours["main"], theirs.get("main"))


def generated_c(functions: int) -> str:
    lines = []
    for i in range(functions):
        lines.append(f"int f{i}(int *a, int n) {{ int s = {i}; for (int j = 0; j < n; j++) {{ if (a[j] % {i % 7 + 2}) "
                     f"s += a[j] * {i % 13 + 1}; else s ^= a[(j + {i}) % n]; }} switch (s & 7) {{ case 0: "
                     f"s += f{max(i - 1, 0)}(a, n / 2); break; case 1: s -= {i}; break; default: s *= 3; }} return s; }}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_python_perf_trampolines(tmp_path, version):
    """pyenv's Python 3.12 and 3.13 with -X perf: the py:: trampolines (anonymous memory, no CFI, no frame
    pointer) join the interpreter's frames, so the Python caller of the hot function holds >= 80 % inclusive.
    3.13 lays its trampolines 16 bytes apart, 3.12 end to end (11 bytes): with 3.12's stride, 3.13's
    stacks stopped in a trampoline (0-32 % complete)."""
    pythons = sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python3"))
    assert pythons, f"pyenv's Python {version} is on this image"
    script = tmp_path / "loop.py"
    script.write_text(PYTHON_LOOP)
    ours, meta = optrace_children(tmp_path, [str(pythons[-1]), "-X", "perf", str(script), "150"])
    caller = f"py::caller:{script}"
    assert ours.get(caller, 0) >= 80, sorted(ours.items(), key=lambda item: -item[1])[:10]
    assert ours.get(f"py::hot:{script}", 0) >= 80
    quality = meta["stack_quality"]
    assert quality.get("complete", 0) >= 0.95 * sum(quality.values()), quality
