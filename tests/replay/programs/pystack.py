"""A Python stack of known shape for replay snapshots (tests/replay/make_snapshot.py): <module> -> внешний ->
mïddle -> through_builtin -> sorted() (C) -> <lambda> -> leaf, spinning in leaf for ever, while two other
threads wait (so the spinning thread's state is not the first of the interpreter's list). Each call has code
after it, and two names are not ASCII (a 1-byte and a 2-byte str): the names and lines below are the
snapshots' expected stack, change them and make the snapshots again."""
import sys
import threading


def leaf(x):
    print("ready", flush=True)
    while x > 0:
        x = x + 1
    return x


def through_builtin(x):
    result = sorted([x, 1], key=lambda v: leaf(v)
                    + 1)
    return result


def mïddle(x):
    result = through_builtin(x + 1)
    return result


def внешний():
    result = mïddle(1)
    return result


if __name__ == "__main__":
    sys.setswitchinterval(1000)
    never = threading.Event()
    waiting = [threading.Thread(target=never.wait, daemon=True) for _ in range(2)]
    for thread in waiting:
        thread.start()
    внешний()
    print("unreachable")
