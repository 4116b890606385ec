"""Threads that want the GIL: three ``spin`` threads run Python code and take turns with the GIL, a
``sleeper`` sleeps 10 ms at a time (it waits for the GIL after each sleep too). Runs for SECONDS; with
``--wait``, from a line read on stdin."""
import sys
import threading
import time


def spin(until):
    x = 0
    while time.time() < until:
        x += 1  # hot: spin


def sleeper(until):
    while time.time() < until:
        time.sleep(0.01)


def main(seconds):
    until = time.time() + seconds
    threads = [threading.Thread(target=spin, args=(until,)) for _ in range(3)]
    threads.append(threading.Thread(target=sleeper, args=(until,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    if "--wait" in sys.argv:
        sys.stdin.readline()
    main(float(sys.argv[1]))
