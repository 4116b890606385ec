"""A session's stack copies (bpf/stackcopy.c): read as they come, walked at each drain once their process's
tables are there (frontend/unwind/copies.py), those tables asked of the unwind scheduler meanwhile.

The sampler copies a sample's user stack when its process has no loaded table: :class:`CopyWatcher` reads
the copies as they come, so a process's first copy has its mappings captured at once (the drain loop may
be busy for a fraction of a second, and a compiler's assembler lives for milliseconds). Each drain walks
the copies its samples name; samples whose tables are still being read wait (copies.py's bounds), and the
last drain waits up to FINAL_TABLES_S for them.
"""
from __future__ import annotations

import select
import threading
from collections.abc import Callable

from optrace.bpf.profiler import DrainResult, Profiler
from optrace.frontend.unwind.copies import StackCopies
from optrace.frontend.unwind.scheduler import UnwindScheduler
from optrace.model import RawSample

WATCH_POLL_MS = 200  # the copy watcher's longest sleep (it looks whether the session ends)
WATCH_PAUSE_S = 0.01
FINAL_TABLES_S = 10.0  # how long the last drain waits for the tables of processes whose copies wait


class CopyWalks:
    """The session's part in stack copies: the copies read (on the watcher's thread and at each drain), the
    drain's samples walked with them, the tables of the processes they are of loaded by ``unwinder``
    (told of each table loaded through its ``on_tables``). :meth:`close` stops the watcher."""

    def __init__(self, profiler: Profiler, unwinder: UnwindScheduler, contain: Callable[..., object]) -> None:
        self.profiler = profiler
        self.unwinder = unwinder
        stored_rows = unwinder.unwinding.tables.stored_rows if unwinder.unwinding is not None else lambda _key: None
        self.copies = StackCopies(lambda key: profiler.unwind.rows(key) or stored_rows(key))
        unwinder.on_tables = self.copies.add_tables
        self._read_lock = threading.Lock()
        self._watcher = CopyWatcher(profiler.copies.fd, lambda: contain("stack_copies", self._read))

    def _read(self) -> None:
        """The stack copies in the sampler's ring (the copy watcher's thread, and each drain after its flip):
        the processes they are of get their tables now, their mappings captured while they live."""
        with self._read_lock:  # a drain resolves no copy another thread has read but not added yet
            copies = self.profiler.read_copies()
            wanted = self.copies.add_copies(copies, lambda pid: bool(self.profiler.live_epoch(pid)))
        for copy in copies.values():
            if copy.shared:  # its process's image is kept for it: forgotten at its exit
                self.unwinder.image_kept(copy.pid)
        for pid in wanted:
            self.unwinder.unwind_soon(pid)

    def walk(self, samples: list[RawSample], off_cpu: list[RawSample], result: DrainResult, final: bool,
             leaves: bool = False) -> tuple[list[RawSample], list[RawSample]]:
        """The drain's CPU and off-CPU samples with their stack copies walked, and those that waited for
        their process's tables since earlier drains (``final``: every one of them, after up to
        FINAL_TABLES_S for the tables being read); the processes whose tables are still wanted get them.
        ``leaves``: the caller names leaves only (top without its children column): no sample waits, those
        whose tables are not there come with the frames known before their walk (StackCopies.resolve)."""
        self._read()
        self.copies.keep(result.open_copies)
        self.copies.take_arrived()  # the last drain's, if no one took them: at most one drain's are held
        samples = self.copies.resolve(samples, leaves=leaves)
        off_cpu = self.copies.resolve(off_cpu, off_cpu=True, leaves=leaves)
        if final:
            self._final_tables()
        late, late_off_cpu = self.copies.end_drain(result.exits, final, self.unwinder.pending())
        for pid in self.copies.wanted():  # processes waiting for tables (from their images: maybe gone)
            self.unwinder.unwind_soon(pid)
        for pid in self.profiler.unwind.want(self.copies.take_files_used()):  # they map a large file walks used
            self.unwinder.unwind_later(pid)
        return samples + late, off_cpu + late_off_cpu

    def _final_tables(self) -> None:
        """At the last drain: the tables of every process whose samples wait, asked for now whatever the looks
        budget (an exited one's from the image the kernel kept), and up to FINAL_TABLES_S for them. Only those
        being read were waited for: under load (the budget spent, 383 looks deferred in 8 s) the samples of the
        last two drains of compilers that had exited gave up, cc1 264 of 1,586 (issue 43)."""
        for pid in self.copies.wanted() - self.unwinder.pending():
            self.unwinder.unwind_soon(pid, budgeted=False)
        if self.copies.wanted() & self.unwinder.pending():
            self.unwinder.wait_for(FINAL_TABLES_S, captures=True)

    def arrived(self) -> list[RawSample]:
        """The samples that began waiting for tables at this drain, with the frames known before their walk
        (StackCopies.take_arrived): their process's JIT files are looked for now, while it may still live."""
        return self.copies.take_arrived()

    def waiting(self) -> set[int]:
        """The processes whose samples wait for their tables (a later drain gives them)."""
        return self.copies.wanted()

    def close(self) -> None:
        self._watcher.stop()


class CopyWatcher:
    """A thread that reads the sampler's stack copies as they come: the first copy of a process (or of a
    new epoch of its mappings) wakes it. After a read it pauses WATCH_PAUSE_S: copies that do not wake
    anyone keep the ring readable, read at most that often."""

    def __init__(self, fd: int, read: Callable[[], None]) -> None:
        self._fd = fd
        self._read = read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="optrace-copies", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if poller.poll(WATCH_POLL_MS) and not self._stop.is_set():
                self._read()
                self._stop.wait(WATCH_PAUSE_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
