"""A sampling command starts at a raised priority, and gives it back once its sampler is attached.

What stands between launch and the first sample is CPU work: the interpreter, the imports, the BPF
programs' load and the attach, about 0.18 s of CPU for `record -p` with its programs stored, against 0.08 s
for perf record (measured at the attach, /proc/PID/stat). On a machine whose CPUs are busy, the moment people
reach for a profiler, every runnable task gets its share of a CPU, so that start took several times its
CPU time, and a process with seconds left was gone before it was sampled. So `record`, `top`, `serve` and
`count` run at nice START_NICE from their launch (root, or CAP_SYS_NICE, and only when the user did not
lower optrace's priority: a positive nice is left as it is) until their sampler or probes are attached;
then every thread of the process, those started meanwhile included, is set back to the nice it started
with: the recording competes at the user's priority. perf offers the like on request (``record -r``, a
SCHED_FIFO priority for the whole run); this is the start alone.
"""
from __future__ import annotations

import os

START_NICE = -10
_started_at: int | None = None  # the nice to set back, while raised


def raise_for_start() -> bool:
    """Raise this process's priority for its start (a no-op when not permitted or already raised)."""
    global _started_at
    if _started_at is not None:
        return True
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > 0 or nice <= START_NICE:
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, 0, START_NICE)
    except OSError:  # no CAP_SYS_NICE
        return False
    _started_at = nice
    return True


def start_done() -> None:
    """The sampler is attached: every thread back to the nice the process started with (Linux nices
    threads one by one, and a thread started while raised inherited the raise)."""
    global _started_at
    if _started_at is None:
        return
    nice, _started_at = _started_at, None
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # the thread has ended
            pass
