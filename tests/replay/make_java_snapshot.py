"""Makes the replay's Java snapshots from live JVMs (run as root, from the repo):

    .venv/bin/python tests/replay/make_java_snapshot.py [17 25]

For each JDK: compile workloads/java/Phases.java, run it until its methods are compiled, then stop its main
thread (ptrace) at random moments until the walk shows the design's sort phase (the lambda comparator under
Arrays.sort, a method inlined, main at the bottom, the call stub reached: snapshots/java-NN.*), and again until
it is stopped in the VM or native code and walked from its last Java frame (snapshots/java-NN-vm.*); then,
interpreted (-Xint), until the walk goes through an upcall (the VM linking the lambda calls Java:
snapshots/java-NN-upcall.*). Each stores the pages the tables' reading and the walk read.
"""
from __future__ import annotations

import datetime
import os
import signal
from collections import Counter
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from optrace.frontend.runtimes.hotspot.jvmfile import jvm_file, libjvm_mapping  # noqa: E402
from optrace.frontend.runtimes.hotspot.process import attach_tables  # noqa: E402
from optrace.frontend.runtimes.hotspot.walker import ENTRY, Registers, java_stack  # noqa: E402
from optrace.procfs import read_maps  # noqa: E402

from javasnapshots import JavaSnapshot, save_java  # noqa: E402
from snapshots import LoggedMemory  # noqa: E402
from threadstop import busiest_thread, stopped  # noqa: E402

REPO = HERE.parents[1]
WORKLOAD = REPO / "workloads" / "java" / "Phases.java"
JDKS = {"17": "/usr/lib/jvm/java-17-openjdk-amd64/bin", "25": "/usr/lib/jvm/temurin-25-jdk-amd64/bin"}
ATTEMPTS = 1000
LAUNCHES = 5


class Missed(Exception):
    """No stop of this launch met the design."""


def design_problem(stack, kind: str) -> str | None:
    """None when the stack is one the snapshot is for ("": walked from the registers, in the sort phase's
    comparator; "vm": walked from the last Java frame of a thread in the VM or native code; "upcall": through
    an entry frame where the VM called Java while linking the lambda, interpreted)."""
    names = [frame.name for frame in stack.frames]
    if stack.status != ENTRY or not names or names[-1] != "Phases.main":
        return f"{stack.status}, bottom {names[-1:]}"
    if kind == "upcall":
        return None if stack.upcalls else "no upcall"
    if stack.from_anchor != (kind == "vm"):
        return "walked from the anchor" if stack.from_anchor else "walked from the registers"
    if kind == "vm":
        return None
    if "Phases.lambda$sortPhase$0" not in names or "java.util.Arrays.sort" not in names:
        return "not in the sort phase's comparator"
    if names.index("Phases.lambda$sortPhase$0") > names.index("java.util.Arrays.sort"):
        return "the lambda is not under Arrays.sort"
    if not any(frame.kind == "inlined" for frame in stack.frames):
        return "no inlined frame"
    return None


def make(jdk: str) -> list[Path]:
    bin_dir = Path(JDKS[jdk])
    made = []
    with tempfile.TemporaryDirectory() as classes:
        subprocess.run([str(bin_dir / "javac"), "-d", classes, str(WORKLOAD)], check=True)
        for flags, warm_up, kinds in (([], 4, ("", "vm")), (["-Xint"], 0, ("upcall",))):
            for launch in range(LAUNCHES):  # the upcall lasts a few stops: a launch may miss it
                java = subprocess.Popen([str(bin_dir / "java"), *flags, "-cp", classes, "Phases", "120"],
                                        stdout=subprocess.PIPE, text=True)
                try:
                    java.stdout.readline()
                    time.sleep(warm_up)
                    made += [_snapshot(jdk, java.pid, kind) for kind in kinds]
                    break
                except Missed as missed:
                    print(f"JDK {jdk}, launch {launch + 1}: {missed}", file=sys.stderr)
                finally:
                    java.kill()
                    java.wait()
            else:
                raise SystemExit(f"JDK {jdk}: {kinds} not met in {LAUNCHES} launches")
    return made


def _snapshot(jdk: str, pid: int, kind: str) -> Path:
    os.kill(pid, signal.SIGSTOP)  # while its tables are read: the upcall (linking the lambda) comes soon after "ready"
    entry = libjvm_mapping(read_maps(pid).entries)
    jvm = jvm_file(pid, entry)
    memory = LoggedMemory(pid)
    process = attach_tables(pid, memory, jvm.symbols, jvm.bias(entry), ("make", pid, kind))
    if isinstance(process, str):
        raise SystemExit(f"JDK {jdk}: {process}")
    tid = busiest_thread(pid, "java")
    tables = set(memory.pages)
    os.kill(pid, signal.SIGCONT)
    problems = Counter()
    for attempt in range(ATTEMPTS):
        time.sleep(random.uniform(0.0005, 0.002) if kind == "upcall" else random.uniform(0.005, 0.05))
        memory.pages = set(tables)
        process = attach_tables(pid, memory, jvm.symbols, jvm.bias(entry), ("make", pid, kind))  # its heaps read anew
        with stopped(tid) as regs:
            stack = java_stack(process, Registers(regs.ip, regs.sp, regs.bp, regs.r13), tid)
            problem = design_problem(stack, kind)
            problems[problem] += 1
            if problem is None:
                pages = memory.page_bytes()
                break
    else:
        raise Missed(f"no stop met the design in {ATTEMPTS} attempts: {problems.most_common(5)}")
    snapshot = JavaSnapshot(
        name=f"java-{jdk}{'-' + kind if kind else ''}", about={"made": datetime.date.today().isoformat(), "jdk": process.release,
                                   "program": WORKLOAD.name, "by": "tests/replay/make_java_snapshot.py",
                                   "attempts": attempt + 1},
        registers={"ip": regs.ip, "sp": regs.sp, "bp": regs.bp, "r13": regs.r13}, tid=tid, symbols=jvm.symbols,
        bias=jvm.bias(entry), pages=pages, expected=stack.frames, status=stack.status,
        from_anchor=stack.from_anchor, upcalls=stack.upcalls)
    return save_java(snapshot)


def main(argv: list[str]) -> None:
    for jdk in argv or list(JDKS):
        print(make(jdk))


if __name__ == "__main__":
    main(sys.argv[1:])
