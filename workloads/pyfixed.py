"""A fixed amount of pure-Python work at a chosen stack depth, timed by itself (bench/bench_python.py).

Prints "ready" once it stands DEPTH Python frames deep (plain recursion: one native eval call on 3.11+,
one per frame before), then waits for a line on stdin, does ROUNDS rounds of the same integer and string
work there, prints its own wall and CPU time as JSON (``{"wall_s": ..., "cpu_s": ...}``, the protocol of
workloads/bench_fixed.c), and exits at EOF on stdin. With ``--threads N``, N-1 more threads share the work,
each at the same depth (the GIL lets one run at a time). ``--forever`` spins at the bottom without a go
line, until killed: a steady deep stack to sample; with ``--duty F`` it works F of every 100 ms and sleeps
the rest (a service that is mostly idle).

    python3 pyfixed.py --depth 50 --rounds 200000
"""
import argparse
import sys
import threading
import time

PERIOD = 0.1  # seconds: --duty's cycle

def work(rounds):
    total = 0
    for i in range(rounds):
        total = (total * 31 + len(str(i))) % 1000003
    return total


def work_forever(duty):
    """Work, or work ``duty`` of every PERIOD seconds and sleep the rest."""
    if duty >= 1:
        return work(1 << 62)
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < duty * PERIOD:
            work(1000)
        time.sleep(PERIOD * (1 - duty))


def descend(depth, then):
    if depth <= 1:
        return then()
    return descend(depth - 1, then)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2_000_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--duty", type=float, default=1.0)
    args = parser.parse_args()
    if args.forever:
        helpers = [threading.Thread(target=descend, args=(args.depth, lambda: work_forever(args.duty)), daemon=True)
                   for _ in range(args.threads - 1)]
        for helper in helpers:
            helper.start()
        print("ready", flush=True)
        descend(args.depth, lambda: work_forever(args.duty))
        return
    go = threading.Event()
    share = args.rounds // args.threads
    helpers = [threading.Thread(target=descend, args=(args.depth, lambda: go.wait() and work(share)))
               for _ in range(args.threads - 1)]
    for helper in helpers:
        helper.start()

    def timed():
        print("ready", flush=True)
        sys.stdin.readline()
        wall, cpu = time.perf_counter(), time.process_time()
        go.set()
        work(args.rounds - share * (args.threads - 1))
        for helper in helpers:
            helper.join()
        print('{"wall_s": %.6f, "cpu_s": %.6f}' % (time.perf_counter() - wall, time.process_time() - cpu), flush=True)
        sys.stdin.read()

    descend(args.depth, timed)


if __name__ == "__main__":
    main()
