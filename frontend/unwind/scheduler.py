"""When each process gets its unwind tables: the session's scheduling of :class:`ProcessUnwinding`'s work.

Tables are built off the drain loop (a JVM's libraries take seconds): one worker thread, at most one queued
job per process. A process gets its table when it is first sampled with frame-pointer stacks, at exec for
a recording's targets, again when its mappings changed since (exec, dlopen: a new epoch), and, with
``unwind_busy``, before the sampler attaches for the processes that were using CPU. A process whose stacks
were copied (frontend/unwind/copywalks.py) has its mappings captured at once and its tables built from them
on a worker of their own (frontend/unwind/captures.py): :meth:`UnwindScheduler.unwind_soon`. The session
calls :meth:`UnwindScheduler.unwind_later` and the hooks of its drain and polls; the rest is here.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Protocol

from optrace.bpf.profiler import Profiler
from optrace.bpf.unwindmaps import ProcessMapping
from optrace.frontend.unwind.budget import LOOKS_PER_SECOND, ProcessBudget
from optrace.frontend.unwind.captures import Capture, MappingCaptures
from optrace.frontend.unwind.processmaps import ProcessUnwinding
from optrace.heap import release_free_memory
from optrace.model import RawSample
from optrace.procfs import MapEntry, process_cpu_ticks, read_maps

TRIM_AFTER_RELEASE = 4 << 20  # bytes of unwind rows released at once that are worth giving back at once
BUSY_PROCESSES = 32  # UnwindScheduler.unwind_busy: the busiest processes whose tables load before the attach
BUSY_UNWIND_SECONDS = 3.0  # and how long the attach waits for them
BUSY_WINDOW_SECONDS = 0.25  # the least time their CPU use is measured over (a stored program loads in 0.02 s)
YOUNG_SECONDS = 1.0  # how long after its table was loaded polls look for a process's new mappings
MAX_PROGRAMS = 65536  # exec'd paths kept for processes not seen exiting yet

Contain = Callable[..., object]  # the session's ``_contain(kind, call, *args)``: a failure costs one process
# A process's tables as loaded: (pid, epoch, exec epoch, mappings), for the walks of its stack copies
TablesHook = Callable[[int, int, int, list[ProcessMapping]], None]


class PythonLooks(Protocol):
    """What the scheduler asks of the runtimes (frontend/runtimes/registry.py RuntimeParts, on the worker)."""

    def look_at(self, pid: int, maps: Iterable[MapEntry]) -> object: ...

    def may_run(self, names: Iterable[str]) -> bool: ...

    def to_retry(self, now: float) -> list[int]: ...


class UnwindScheduler:
    """The worker that loads processes' unwind tables into the BPF unwinder (``profiler.unwind``), and what
    it knows of them: which process's table was loaded at which epoch, and when. ``unwinding`` None (call
    graph "fp"): every call does nothing."""

    def __init__(self, profiler: Profiler | None, unwinding: ProcessUnwinding | None, python: PythonLooks | None,
                 contain: Contain, keep_rows: bool = True, fold: bool = False,
                 looks_per_second: float = LOOKS_PER_SECOND) -> None:
        self.profiler = profiler
        self.unwinding = unwinding
        self.python = python
        self._contain = contain
        # False: a file's unwind rows are dropped from the user-space cache once the kernel holds them
        self.keep_rows = keep_rows
        self.fold = fold  # True: the build-ids of each process's tables are kept (:meth:`table_build_ids`)
        self._unwound: dict[int, int] = {}  # pid -> the epoch its unwind mappings were read at
        # fold: pid -> build-ids of every CFI table given for it (set before the table, on the worker)
        self._table_build_ids: dict[int, frozenset[bytes]] = {}
        # pid -> when its table was loaded (monotonic), for YOUNG_SECONDS: the dynamic loader may still be
        # mapping its libraries (a new epoch makes the sampler ignore the table), so polls look at it too.
        # By age, not until the next drain: a table loaded at exec just before a drain would otherwise
        # wait a whole drain interval for the libraries mapped after it (seen: 0.9 s of frame-pointer stacks).
        self._young: dict[int, float] = {}
        # Processes whose table was loaded again for a new epoch (a dlopen), for the session's symbolizer to look
        # at while they still run: their new files' frames are named from it (appended on the worker).
        self._reloaded: deque[int] = deque()
        self._unwind_worker: ThreadPoolExecutor | None = None
        # Python looks that do not wait behind tables being built: a command's interpreter is looked at again
        # every 50 ms until it is initialized (frontend/runtimes/), which the unwind worker, busy
        # building the command's tables, made 20-90 ms of its CPU late (its samples had no Python frames)
        self._python_worker: ThreadPoolExecutor | None = None
        # processes looked at on the Python worker when their tables were queued (:meth:`_python_early`): not
        # again when the table comes (_python_first)
        self._python_early_pids: set[int] = set()
        self._unwind_step: Future | None = None  # the walking program's load, on the worker
        self._unwind_queued: set[int] = set()
        self._captures: MappingCaptures | None = None  # once started (:meth:`unwind_soon`)
        self._programs: dict[int, str] = {}  # pid -> the path it exec'd (for the files of its image)
        self.budget = ProcessBudget(looks_per_second)  # looks at processes per second (budget.py)
        self._imaged: set[int] = set()  # processes whose kernel image was read (forgotten after their exit)
        self._exited_images: list[int] = []  # exited: their images forgotten at the next drain
        self.on_tables: TablesHook | None = None  # told each table loaded (frontend/unwind/copywalks.py)
        # told each capture (pid, its mappings, its files' descriptors: duplicates, the hook's to close): the
        # symbolizer names a process gone before it looked at it from them (Machine.captured)
        self.on_capture: Callable[[int, list[MapEntry], list[int | None]], None] | None = None

    def start(self) -> None:
        """The worker, whose first job is the walking program, verified while sampling starts (frame
        pointers until it is in place), and the capture worker (its threads start with its first job)."""
        if self.unwinding is None:
            return
        self._unwind_worker = ThreadPoolExecutor(1, thread_name_prefix="optrace-unwind")
        if self.python is not None:
            self._python_worker = ThreadPoolExecutor(1, thread_name_prefix="optrace-python")
        self._unwind_step = self._unwind_worker.submit(self._contain, "unwind_step", self.profiler.load_walker)
        self._captures = MappingCaptures(self._capture, lambda pid, capture: self._contain(
            "unwind_tables", self.unwind, pid, capture), self._contain)

    def cancel(self) -> None:
        """No more tables are built: the one being built stops (at the session's end)."""
        if self.unwinding is not None:
            self.unwinding.cancel()

    def close(self) -> None:
        """Stop the worker (the table being built is cancelled: up to its 10 s CPU budget would hold the
        exit), the capture worker, and release the tables' files."""
        if self._unwind_worker is not None:
            self.unwinding.cancel()
            self._unwind_worker.shutdown(wait=True, cancel_futures=True)
            if self._python_worker is not None:
                self._python_worker.shutdown(wait=True, cancel_futures=True)
            self._captures.close()
            self.unwinding.tables.close()

    # -- the session's hooks ---------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        """A poll of the session: young tables whose process mapped more are loaded again."""
        self._reload_changed(self._young_pids(now))
        self._retry_python(now)

    def wants_polls(self, now: float) -> bool:
        """Whether polls are wanted on a timer, events or not: a process whose table was loaded in the
        last YOUNG_SECONDS may still be mapping its libraries, and one whose table is on its way or was
        loaded again is for the session's symbolizer to look at soon (see ``_reloaded``)."""
        return bool(self._young_pids(now) or self._unwind_queued or self._reloaded)

    def _young_pids(self, now: float) -> set[int]:
        """The processes whose table was loaded in the last YOUNG_SECONDS (older ones are dropped)."""
        for pid, loaded in list(self._young.items()):  # the worker adds entries meanwhile
            if now - loaded > YOUNG_SECONDS:
                self._young.pop(pid, None)
        return set(self._young)

    def unwind_processes(self, samples: list[RawSample]) -> None:
        """A drain's samples: processes sampled with frame-pointer stacks, and those whose mappings changed
        since their table was loaded (exec, dlopen), get their tables now."""
        if self.unwinding is None:
            return
        forgotten, self._exited_images = self._exited_images, []
        for pid in forgotten:
            self.profiler.images.forget(pid)
        for pid in {s.pid for s in samples if s.user and not s.stop and s.pid not in self._unwound}:
            self.unwind_later(pid)
        self._reload_changed(set(self._unwound))
        self._young_pids(time.monotonic())  # drops the old ones (serve does not poll)
        self._retry_python(time.monotonic())

    def _reload_changed(self, pids: set[int]) -> None:
        """Load again the tables of processes whose mappings changed since (exec, dlopen)."""
        for pid in pids:
            if pid in self._unwound and self.profiler.epoch(pid) != self._unwound[pid]:
                self.unwind_later(pid)

    def execd(self, pid: int, program: str | None = None) -> None:
        """The process exec'd (``program``: the path it exec'd, if known): its table is of its old program."""
        self._unwound.pop(pid, None)
        if program and self.unwinding is not None:
            self._programs[pid] = program
            while len(self._programs) > MAX_PROGRAMS:  # exits lost (a full event buffer): the oldest go
                del self._programs[next(iter(self._programs))]

    def image_kept(self, pid: int) -> None:
        """The kernel keeps the process's image after its exit (a copy of its stack needs it): forgotten at
        its exit event."""
        self._imaged.add(pid)

    def exited(self, pid: int) -> None:
        """The process exited: its table goes at once, and the kernel's image of it (read already)."""
        self._young.pop(pid, None)
        self._programs.pop(pid, None)
        if self._unwound.pop(pid, None) is not None:
            self.profiler.unwind.forget_process(pid)
        if pid in self._imaged:  # one drain later: samples taken as it exited may come with the next drain
            self._imaged.discard(pid)
            self._exited_images.append(pid)

    def drop_unwound_exited(self) -> None:
        """The tables of processes gone without an exit event seen, or loaded by the worker after their
        exit was handled (now and then: each one is a look in /proc)."""
        if self.unwinding is None:
            return
        loaded = list(self._unwound)  # at once: the worker adds to it meanwhile
        for pid in [pid for pid in loaded if not os.path.exists(f"/proc/{pid}")]:
            self._unwound.pop(pid, None)
            self.profiler.unwind.forget_process(pid)

    def table_build_ids(self, pid: int) -> frozenset[bytes]:
        """With ``fold``: the build-ids of every table given for the process (its folded frames' files)."""
        return self._table_build_ids.get(pid, frozenset())

    def forget(self, pid: int) -> None:
        self._table_build_ids.pop(pid, None)
        self._python_early_pids.discard(pid)

    def sizes(self) -> dict[str, int]:
        if self.unwinding is None:
            return {}
        tables = self.unwinding.tables
        return {**self.profiler.unwind.sizes(), "unwind_processes": len(self._unwound),
                "unwind_tables": len(tables), "unwind_tables_bytes": tables.held_bytes,
                "process_looks": self.budget.taken.total(), "process_looks_deferred": self.budget.deferred.total()}

    def touch(self, pids: Iterable[int]) -> None:
        """These processes were sampled now: their files are in use (bpf/unwindmaps.py's generations)."""
        if self.unwinding is not None:
            self.profiler.unwind.touch(pids)

    # -- loading ---------------------------------------------------------------------------------------
    def unwind(self, pid: int, capture: Capture | None = None) -> None:
        """Give the BPF unwinder the process's executable mappings and their unwind tables (the epoch
        first, as in the session's ``learn``: a mapping made meanwhile makes the sampler ignore this table),
        read now or ``capture``d before; :attr:`on_tables` (the walks of its stack copies) gets them too."""
        if self.unwinding is None:
            return
        maps = self.profiler.unwind
        loaded = None if self.keep_rows else maps.is_loaded
        own = pid == os.getpid()  # walked by frame pointers (see unwind_later)
        self._python_first(pid, own, capture)
        exec_epoch: int | None = 0
        if capture is not None and capture.image is not None:
            self._unwind_image(pid, capture, loaded)
            return
        if own:
            epoch = self.profiler.epoch(pid)
            mappings = self.unwinding.frame_pointer_mappings(pid)
        elif capture is not None:
            epoch, exec_epoch = capture.epoch, capture.exec_epoch
            mappings = self.unwinding.mappings_of(capture.maps, loaded)
        else:
            epoch, exec_epoch = self.profiler.epoch(pid), self.profiler.exec_epoch(pid)
            mappings = self.unwinding.mappings(pid, loaded)
            if self.profiler.exec_epoch(pid) != exec_epoch:  # exec'd meanwhile: not the mappings of its copies
                exec_epoch = None
        if not epoch or mappings is None:
            return
        self._load(pid, epoch, exec_epoch, mappings, loaded, own=own)

    def _load(self, pid: int, epoch: int, exec_epoch: int | None, mappings: list[ProcessMapping],
              loaded: Callable[[Hashable], bool] | None, own: bool = False) -> None:
        """Load the process's table read at ``epoch`` into the kernel; :attr:`on_tables` gets it too (unless
        ``exec_epoch`` is None: exec'd while read)."""
        maps = self.profiler.unwind
        generation = maps.generation
        if self.fold:  # before the table: a stack it unwinds may be drained at once
            ids = frozenset(m.build_id for m in mappings if m.build_id)
            self._table_build_ids[pid] = self._table_build_ids.get(pid, frozenset()) | ids
        maps.load_process(pid, epoch, mappings)
        for dropped in maps.take_dropped():  # they mapped a file evicted to make room: loaded again once sampled
            self._unwound.pop(dropped, None)
        if maps.generation != generation:  # every other table was dropped: loaded again once sampled
            self._unwound = {}
            if loaded is not None and not own:  # and this one's files that came without rows got none: ask again
                mappings = self.unwinding.mappings(pid, loaded) or []
                maps.load_process(pid, epoch, mappings)
        if self.on_tables is not None and exec_epoch is not None:
            self.on_tables(pid, epoch, exec_epoch, self._without_held_rows(mappings, loaded))
        if loaded is not None and self.unwinding.release(mappings, loaded) >= TRIM_AFTER_RELEASE:
            release_free_memory()
        if not own and pid in self._unwound:
            self._reloaded.append(pid)
        self._unwound[pid] = epoch
        self._young[pid] = time.monotonic()

    def _unwind_image(self, pid: int, capture: Capture, loaded: Callable[[Hashable], bool] | None) -> None:
        """:meth:`unwind` from the kernel's image of the process: loaded into the kernel while the process still
        has the image's epoch, else (gone, or it mapped more since) only handed to its copies' walks."""
        alive = self.profiler.live_epoch(pid) == capture.epoch
        mappings = self.unwinding.mappings_of_image(pid, capture.image, self._programs.get(pid), alive, loaded)
        if mappings is None:
            return
        for executable, linker in self.unwinding.images.take_linkers().items():  # later images walk in BPF
            self.profiler.unwind.set_interp(executable, linker)
        if not alive:  # gone: its files still load, for the next processes of its programs (walked from images)
            self.profiler.unwind.load_files(mappings)
            if self.on_tables is not None:
                self.on_tables(pid, capture.epoch, capture.exec_epoch, self._without_held_rows(mappings, loaded))
            if loaded is not None:
                self.unwinding.release(mappings, loaded)
            return
        self._load(pid, capture.epoch, capture.exec_epoch, mappings, loaded)

    def _without_held_rows(self, mappings: list[ProcessMapping], loaded: Callable[[Hashable], bool] | None
                           ) -> list[ProcessMapping]:
        """``mappings`` for the walks of copies: without ``keep_rows``, without the rows the kernel holds (read
        back from it when a walk needs them), so each process's tables do not keep a copy of its files' rows."""
        if loaded is None:
            return mappings
        return [dataclasses.replace(m, rows=None) if m.rows is not None and loaded(m.file_key) else m
                for m in mappings]

    def take_reloaded(self) -> list[int]:
        """The processes whose table was loaded again since the last call (see ``_reloaded``)."""
        taken = []
        while self._reloaded:
            taken.append(self._reloaded.popleft())
        return taken

    def _python_first(self, pid: int, own: bool, capture: Capture | None) -> None:
        """The Python walker gets the process before the CFI walker its table: a CFI walk with no Python walker
        yet leaves the eval frames bare (1 % of a 3.13 recording's samples, those walked in the 0.1 s the
        interpreter's look took after the table). Only a process one of whose files is named like an
        interpreter is looked at, when its captured mappings or image say which files it has."""
        if self.python is None or own:
            return
        if pid in self._python_early_pids:
            self._python_early_pids.discard(pid)
            return
        entries = capture.maps.entries if capture is not None and capture.maps is not None else None
        if entries is not None:
            names = [os.path.basename(entry.file_path) for entry in entries]
        else:
            names = self.unwinding.images.names(capture.image) if capture is not None and capture.image else None
        if names is not None and not self.python.may_run(names):
            return
        if capture is None:
            self._contain("python", self._look_at_python, pid)
        else:  # on the capture worker
            self._python_later(pid, entries)

    def _look_at_python(self, pid: int, entries: list[MapEntry] | None = None) -> None:
        """Whether the process runs a CPython the walker can expand (frontend/runtimes/), from its mappings
        (``entries``, else read now if the budget allows)."""
        if entries is None:
            if not self.budget.take("python_maps"):
                return
            maps = read_maps(pid)
            entries = maps.entries if maps is not None else None
        if entries is not None:
            self.python.look_at(pid, (entry for entry in entries if entry.executable and entry.is_file))

    def _retry_python(self, now: float) -> None:
        """Look again, on the worker, at processes whose interpreter was not initialized when first looked at."""
        if self.python is None:
            return
        for pid in self.python.to_retry(now):
            self._python_later(pid)

    def python_soon(self, pid: int) -> None:
        """Whether the process runs a CPython, looked at on the Python worker now: a target's samples copied
        until its tables come then keep their Python frames (bpf/copypython.c)."""
        if self.python is not None and self._python_worker is not None:
            self._python_later(pid)

    def _python_later(self, pid: int, entries: list[MapEntry] | None = None) -> None:
        """:meth:`_look_at_python` on the Python worker."""
        try:
            self._python_worker.submit(self._contain, "python", self._look_at_python, pid, entries)
        except RuntimeError:  # shut down: the session is ending
            pass

    def unwind_later(self, pid: int, program: str | None = None, budgeted: bool = True) -> None:
        """:meth:`unwind` on the worker thread (the sampler walks the process by frame pointers until then).
        With the ``program`` it exec'd, that program's tables are built first even if it is gone by then
        (a compiler's first cc1 is: the next one finds them ready).

        optrace's own process is walked by frame pointers only, through a table without rows (its frames
        named by file, so its samples fold like others': at 10k samples a second, decoding its raw stacks at
        every drain was a sixth of the drain): BCC maps libLLVM, libclang-cpp and libz3, 2.3 M unwind rows,
        more than the kernel's row array holds (bpf/unwindmaps.py). Unwinding it cost serve 2 s of
        conversion and 40 MB of transient memory at start and after every new generation, and its rows
        filled 80 % of the array, so other processes' files started new generations sooner."""
        if program and self.python is not None and self._python_worker is not None:  # an exec: looked at from
            self._python_later(pid)  # its start (a table queued for its previous program would hold it back)
        if self._unwind_worker is None or pid in self._unwind_queued:
            return
        if budgeted and not self.budget.take("tables"):
            return
        self._unwind_queued.add(pid)
        try:
            self._unwind_worker.submit(self._unwind_job, pid, program)
        except RuntimeError:  # shut down: the session is ending
            self._unwind_queued.discard(pid)
            return
        if not program:  # (an exec's look is queued above)
            self._python_early(pid)

    def _unwind_job(self, pid: int, program: str | None) -> None:
        try:
            if program:
                self._contain("unwind_tables", self.unwinding.warm, program)
            self._contain("unwind_tables", self.unwind, pid)
        finally:
            self._unwind_queued.discard(pid)

    def unwind_soon(self, pid: int, budgeted: bool = True) -> None:
        """The tables of a process whose stacks were copied, from its mappings captured now (see
        frontend/unwind/captures.py: a short-lived process is gone by the time the worker, busy converting
        another's files, gets to it); without a capture, or for a process whose exec the session did not
        see (running before it: not short-lived, likely), :meth:`unwind_later`. ``budgeted`` False: not
        counted against the looks per second (the last drain's waiting samples: no later drain asks again)."""
        if self._captures is None or self.is_loaded(pid) or pid in self._captures.pending():
            return
        if not self.profiler.exec_epoch(pid):
            self.unwind_later(pid, budgeted=budgeted)
        elif not budgeted or self.budget.take("tables"):
            if self._captures.capture(pid, self.profiler.live_epoch(pid)):
                self._python_early(pid)
            else:
                self.unwind_later(pid, budgeted=False)

    def _python_early(self, pid: int) -> None:
        """Whether a process whose tables are queued runs a CPython, looked at on the Python worker now, not
        when its tables come: under record -a on a busy machine the table workers convert other processes'
        files for tens of seconds, and every Python process behind them kept native stacks only (the walker
        had neither a real workload nor the hostile fakes of tests/hostile/test_python_refusal.py in 40 s)."""
        if self.python is None or self._python_worker is None or pid in self._python_early_pids:
            return  # (one look until its tables come)
        self._python_early_pids.add(pid)
        try:
            self._python_worker.submit(self._contain, "python", self._look_early, pid)
        except RuntimeError:  # shut down: the session is ending
            self._python_early_pids.discard(pid)

    def _look_early(self, pid: int) -> None:
        """:meth:`_look_at_python`, for a process none of whose files the kernel's image names like an
        interpreter not even a read of its maps."""
        image = self._image(pid)
        if image is not None and not self.python.may_run(self.unwinding.images.names(image.image)):
            return
        self._look_at_python(pid)

    def _capture(self, pid: int) -> Capture | None:
        """The kernel's image of the process (bpf/images.py), else (none, one that may miss a mapping, or one of
        another file tree when the symbolizer wants captures) its mappings read now, their files held open, with
        the epochs read before (see the session's ``learn``); None when it is gone or exec'd meanwhile without an
        image (its copies then wait for the next look)."""
        image = self._image(pid)
        if image is not None and image.image.complete and (self.on_capture is None
                                                           or self.unwinding.images.ours(image.image)):
            return image  # (a container's process: its files are read through its maps, for the symbolizer too)
        epoch, exec_epoch = self.profiler.epoch(pid), self.profiler.exec_epoch(pid)
        maps = self.unwinding.capture(pid)
        if maps is not None and (self.profiler.exec_epoch(pid) != exec_epoch or not maps.entries):  # or exiting
            maps.close()
            return image
        if maps is not None and self.on_capture is not None:
            self._contain("process_maps", lambda: self.on_capture(pid, maps.entries, duplicates(maps.fds)))
        return image if maps is None else Capture(epoch, exec_epoch, maps)

    def _image(self, pid: int) -> Capture | None:
        """The kernel's image of the process since its last exec, as a capture at the epoch of its last
        mapping; None when it has none."""
        images = self.profiler.images
        if images is None or not images.enabled:
            return None
        image = images.image(pid)
        exec_epoch = self.profiler.exec_epoch(pid)
        if image is None or image.exec_epoch != exec_epoch:
            return None
        self._imaged.add(pid)
        return Capture(max([exec_epoch, *(m.epoch for m in image.maps)]), exec_epoch, image=image)

    def is_loaded(self, pid: int) -> bool:
        """Whether the kernel holds the process's table read at its current epoch (copies taken before it
        was loaded may still come)."""
        return self._unwound.get(pid) == self.profiler.live_epoch(pid) and self.profiler.unwind.has_process(pid)

    def pending(self) -> set[int]:
        """The processes whose tables are being read, or will be from their captured mappings."""
        return self._unwind_queued | (self._captures.pending() if self._captures is not None else set())

    def wait_for(self, seconds: float, captures: bool = False) -> None:
        """Wait up to ``seconds`` for the jobs queued so far (one worker thread: a job queued now runs after
        them), and with ``captures`` for the capture worker's (waited for themselves); what is not done by
        then goes on after."""
        if self._unwind_worker is None:
            return
        deadline = time.monotonic() + seconds
        try:
            futures_wait([self._unwind_worker.submit(lambda: None)], timeout=seconds)
        except RuntimeError:  # shut down: the session is ending
            return
        if captures and self._captures is not None:
            self._captures.wait(deadline)

    def unwind_busy(self, cpu_before: Mapping[int, int], measured_from: float, learn: Callable[[int], None]) -> None:
        """Wait for the walker, then load the tables of the processes that used CPU since ``cpu_before``
        (taken at ``measured_from``, at least BUSY_WINDOW_SECONDS ago: CPU time is counted in 10 ms ticks;
        the busiest first, at most BUSY_PROCESSES) and optrace's own, for up to BUSY_UNWIND_SECONDS:
        what is not loaded by then is loaded once sampled, as without this. ``learn``: the session's, each
        process's mappings read before its table is asked for."""
        self._unwind_step.result()
        time.sleep(max(0.0, measured_from + BUSY_WINDOW_SECONDS - time.monotonic()))
        cpu_after = process_cpu_ticks()
        used = {pid: ticks - cpu_before.get(pid, 0) for pid, ticks in cpu_after.items()}
        own = os.getpid()
        busy = sorted((pid for pid, ticks in used.items() if ticks > 0 and pid != own), key=used.__getitem__,
                      reverse=True)
        for pid in [own, *busy[:BUSY_PROCESSES]]:
            learn(pid)
            self.unwind_later(pid, budgeted=False)
        self.wait_for(BUSY_UNWIND_SECONDS)  # after the jobs above

    def prepare_unwind(self, executable: str) -> None:
        """Build the unwind tables of a program about to be started (and its libraries) now, and wait for
        the walking program: the command's stacks are unwound from its first instruction."""
        if self.unwinding is not None:
            self._contain("unwind_tables", self.unwinding.warm, executable)
            self._unwind_step.result()


def duplicates(fds: list[int | None]) -> list[int | None]:
    """A duplicate of each descriptor (None stays None); none left open when one cannot be made."""
    made: list[int | None] = []
    try:
        for fd in fds:
            made.append(None if fd is None else os.dup(fd))
    except OSError:
        for fd in made:
            if fd is not None:
                os.close(fd)
        raise
    return made
