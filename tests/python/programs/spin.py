"""Known stacks for the reference walker: the main thread spins in c() under a() -> b() -> c(); a second thread
spins in rank(), called back by sorted() (a C builtin, so rank starts a new eval call). Prints one line per
thread, "NAME pthread_id native_id", once both are spinning."""
import os
import threading


def say(name):
    os.write(1, f"{name} {threading.get_ident()} {threading.get_native_id()}\n".encode())


def c():
    say("main")
    while True: pass  # LINE c


def b():
    c()  # LINE b


def a():
    b()  # LINE a


def rank(x):
    say("worker")
    while True: pass  # LINE rank


def worker():
    sorted(range(3), key=rank)  # LINE worker


if __name__ == "__main__":
    threading.Thread(target=worker, daemon=True).start()
    a()  # LINE module
