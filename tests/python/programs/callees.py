"""A pure-Python job whose middle function has all its time in its callees, as a template engine's ``render``:
``render`` calls ``parse`` on one line and ``split_words`` on two others, and does nothing itself. The callees
do the work in the interpreter's own C code (``int(str(...))``, ``str.split``), as Python code mostly does, and
account their own CPU time (time.thread_time), printed as JSON when the program ends:
``{"parse": s, "split_words": s}``. By design parse takes about 2/3 of the time, split_words 1/3 (half on
each of its two lines). Runs until it has had SECONDS of CPU time (however busy the machine), or with
``--wall`` for SECONDS of wall-clock time, then exits. Runs on CPython 3.6+."""
import json
import sys
import time

spent = {"parse": 0.0, "split_words": 0.0}


def parse(n):
    start = time.thread_time()
    total = 0
    for i in range(n):
        total += int(str(i * 7919)) % 13
    spent["parse"] += time.thread_time() - start
    return total


def split_words(n):
    start = time.thread_time()
    words = 0
    for _ in range(n):
        words += len(("alpha beta gamma delta " * 20).split())
    spent["split_words"] += time.thread_time() - start
    return words


def render(rounds):
    total = 0
    for _ in range(rounds):
        total += parse(10000)  # calls: parse
        total += split_words(250)  # calls: split_words, first
        total += split_words(250)  # calls: split_words, second
    return total


def main(seconds, clock):
    until = clock() + seconds
    while clock() < until:
        render(10)
    print(json.dumps(spent), flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), time.time if "--wall" in sys.argv else time.thread_time)
