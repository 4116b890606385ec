"""Ground truth for a Python waker (record --off-cpu --wakers): the main thread makes items, burning CPU for
each, and hands each over in ``hand_over`` (queue.Queue.put, which wakes the consumer from C); the consumer
thread waits for them in ``take``. The consumer's own blocked time (around its waits) and its native thread id
go to stderr as one JSON line at exit. Arguments: items (default 100), CPU seconds per item (default 0.01)."""
import json
import queue
import sys
import threading
import time


def burn(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def hand_over(items, item):
    items.put(item)


def produce(items, count, seconds):
    for item in range(count):
        burn(seconds)
        hand_over(items, item)
    hand_over(items, None)


def take(items, blocked):
    started = time.perf_counter()
    item = items.get()
    blocked[0] += time.perf_counter() - started
    return item


def consume(items, blocked, ids):
    ids.append(threading.get_native_id())
    while take(items, blocked) is not None:
        pass


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
    items, blocked, ids = queue.Queue(), [0.0], []
    consumer = threading.Thread(target=consume, args=(items, blocked, ids))
    consumer.start()
    produce(items, count, seconds)
    consumer.join()
    print(json.dumps({"consumer": {"blocked": blocked[0], "tid": ids[0]}}), file=sys.stderr)


main()
