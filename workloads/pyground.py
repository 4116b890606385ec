"""A Python workload with known shares of CPU time across its functions (tests/python, bench/).

The main thread runs timed phases in turn, each for a fixed slice of the thread's own CPU time
(time.thread_time): ``tokenize`` 40 %, ``encode_all`` 30 % (a C builtin, ``sorted``, calling back into the
Python function ``rank``), ``decode_all`` 30 %. A second thread runs ``checksum``: one SHA-256 of 32 MiB
(about 20 ms of CPU here, in C with the GIL released for all of it), then a 40 ms wait, so it takes about a
third of a CPU beside the main thread, under the machine's 2 CPUs.

Why it is shaped so (both matter to a profiler that samples by wall clock, as py-spy does): a thread that
waits for a CPU is sampled by py-spy, not by a CPU profiler, so the two threads' demand stays under 2 CPUs;
and a thread that waits for the GIL is "active" for py-spy ``--nonblocking`` on CPython up to 3.10 (it
has no OS thread to ask there and guesses from the Python frame, and only a wait in threading.py reads as
idle), so the checksum thread takes the GIL twice per 60 ms cycle, and the switch interval is 1 ms instead
of 5 so that each take waits at most about that. Its first version hashed 64 KiB blocks in a loop and
spent ~90 % of its time waiting for the GIL: 0.18 s of CPU in 4 s, where py-spy saw 3x more.

How the machine runs them still varies, so the process reports what each function actually got: the CPU
seconds of each function so far, as JSON, written to the file named by ``--report`` at the end (or on
SIGTERM) and at each SIGUSR1: ``{"spent": {...}, "marks": [...]}``, where each SIGUSR1 adds a copy of
``spent`` at that moment to ``marks`` (two marks around a profiler's window give the shares of that
window, while the process goes on). Runs on CPython 3.6 and later; no flag is needed to profile it.

    python3 pyground.py --seconds 6 --report /tmp/shares.json

``--cpu-seconds N`` ends the phases after N seconds of the main thread's own CPU time instead: on a loaded
machine the run takes longer, but each function still gets its share of a known amount of work (in 3 s of
wall time at load 30 the main thread got a few tens of ms, and a phase could be left without a sample).
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time

SLICES = (("tokenize", 0.040), ("encode_all", 0.030), ("decode_all", 0.030))
HASHED = 32 << 20  # bytes hashed per checksum cycle
PAUSE = 0.040  # seconds the checksum thread waits between two
spent = {"tokenize": 0.0, "encode_all": 0.0, "decode_all": 0.0, "checksum": 0.0}
marks = []
stop = threading.Event()


def tokenize(until):
    words = 0
    while time.thread_time() < until:
        text = "alpha beta gamma delta " * 20
        words += len(text.split())
    return words


def rank(word):
    score = 0
    for ch in word:
        score = (score * 31 + ord(ch)) % 1000003
    return score


def encode_all(until):
    words = ["w%05d" % i for i in range(200)]
    total = 0
    while time.thread_time() < until:
        total += len(sorted(words, key=rank))
    return total


def decode_all(until):
    total = 0
    while time.thread_time() < until:
        for i in range(500):
            total += int(str(i * 7919)) % 13
    return total


def checksum(block):
    digest = b""
    while not stop.is_set():
        start = time.thread_time()
        digest = hashlib.sha256(block).digest()  # the GIL is released while it hashes
        spent["checksum"] += time.thread_time() - start
        stop.wait(PAUSE)
    return digest


def write_report(path):
    """The account so far, replacing the file's at once (a reader never sees half of it)."""
    if path:
        with open(path + ".part", "w") as out:
            json.dump({"spent": spent, "marks": marks}, out)
        os.replace(path + ".part", path)


def mark(path):
    marks.append(dict(spent))
    write_report(path)


def run_main(deadline, clock):
    while clock() < deadline and not stop.is_set():
        for name, share in SLICES:
            start = time.thread_time()
            globals()[name](start + share)
            spent[name] += time.thread_time() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--cpu-seconds", type=float, default=0.0,
                        help="run the phases for this much of the main thread's CPU time instead of --seconds")
    parser.add_argument("--report", default="")
    args = parser.parse_args()
    sys.setswitchinterval(0.001)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: mark(args.report))
    worker = threading.Thread(target=checksum, args=(bytes(HASHED),), name="checksum")
    worker.start()
    try:
        if args.cpu_seconds:
            run_main(time.thread_time() + args.cpu_seconds, time.thread_time)
        else:
            run_main(time.monotonic() + args.seconds, time.monotonic)
    except KeyboardInterrupt:
        pass
    stop.set()
    worker.join()
    write_report(args.report)


if __name__ == "__main__":
    main()
