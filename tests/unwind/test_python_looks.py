"""The scheduler's early Python look (frontend/unwind/scheduler.py ``_look_early``) at a process whose tables are
queued: a kernel image that names every file decides without /proc; one with a file not named yet is not looked
at early (its look comes at its exec or with its tables), and never fails.

main raised TypeError for the second (``may_run(None)``): under issue 42's exec storm a 30 s ``record -a``
carried ~100 "python failed and was skipped" warnings.
"""
from __future__ import annotations

import os

from optrace.bpf.images import ProcessImage
from optrace.containment import contain
from optrace.frontend.unwind.scheduler import UnwindScheduler

EXEC_EPOCH = 7
IMAGE = ProcessImage(EXEC_EPOCH, 0x1000, 0x2000, 0, (1, 2, 3, 4), (1, 2), 3, (), 0, False)


class Images:
    enabled = True

    def image(self, _pid: int) -> ProcessImage:
        return IMAGE


class Profiler:
    images = Images()

    def exec_epoch(self, _pid: int) -> int:
        return EXEC_EPOCH


class ImageFiles:
    def __init__(self, names: list[str] | None) -> None:
        self._names = names

    def names(self, _image: ProcessImage) -> list[str] | None:
        return self._names


class Unwinding:
    def __init__(self, names: list[str] | None) -> None:
        self.images = ImageFiles(names)


class Python:
    def __init__(self) -> None:
        self.looked: list[int] = []

    def may_run(self, names) -> bool:
        return any(name.startswith("python") for name in names)

    def look_at(self, pid: int, maps) -> None:
        list(maps)
        self.looked.append(pid)


def _scheduler(names: list[str] | None) -> tuple[UnwindScheduler, Python, list[Exception]]:
    failures: list[Exception] = []
    python = Python()
    scheduler = UnwindScheduler(Profiler(), Unwinding(names), python,
                                lambda _kind, call, *args: contain(lambda: call(*args), failures.append))
    return scheduler, python, failures


def test_an_image_naming_no_interpreter_costs_no_look():
    scheduler, python, failures = _scheduler(["true", "libc.so.6"])
    scheduler._contain("python", scheduler._look_early, os.getpid())
    assert (python.looked, failures) == ([], [])


def test_an_image_naming_an_interpreter_is_looked_at():
    scheduler, python, failures = _scheduler(["python3.11", "libc.so.6"])
    scheduler._contain("python", scheduler._look_early, os.getpid())
    assert (python.looked, failures) == ([os.getpid()], [])
    assert scheduler.budget.taken == {"python_maps": 1}


def test_an_image_with_a_file_not_named_yet_is_not_looked_at_early_and_does_not_fail():
    scheduler, python, failures = _scheduler(None)
    scheduler._contain("python", scheduler._look_early, os.getpid())
    assert failures == []
    assert python.looked == []
    assert scheduler.budget.taken == {}
