"""A Python program whose stacks mix Python and native frames: ``sort_phase`` calls the C builtin ``sorted``,
which calls back into the Python function ``rank``; a second thread runs ``tokenize``; with ``--child``, a
child interpreter runs ``child_loop`` too. Runs for SECONDS, then exits."""
import subprocess
import sys
import threading
import time


def rank(x):
    score = 0
    for i in range(20):
        score += (x * i) % 7  # hot: rank
    return score


def sort_phase(items):
    return sorted(items, key=rank)


def tokenize(n):
    return [str(i) * 3 for i in range(n)]  # hot: tokenize


def worker(until):
    while time.time() < until:
        tokenize(2000)


def child_loop(until):
    total = 0
    while time.time() < until:
        total += sum(i * i for i in range(1000))  # hot: child_loop
    return total


def main(seconds, child):
    until = time.time() + seconds
    children = []
    if child:
        code = "import sys; sys.path.insert(0, %r); import mixed; mixed.child_loop(%r)" % (sys.path[0], until)
        children.append(subprocess.Popen([sys.executable, "-c", code]))
    thread = threading.Thread(target=worker, args=(until,), name="worker")
    thread.start()
    while time.time() < until:
        sort_phase(list(range(2000)))
    thread.join()
    for process in children:
        process.wait()


if __name__ == "__main__":
    main(float(sys.argv[1]), "--child" in sys.argv)
