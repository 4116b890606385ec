"""Records that cross module boundaries.

Data flows one way: the kernel's maps give :class:`RawSample` (bpf/), the symbolizer turns them into
:class:`Sample` rows over a shared :class:`Frame` table, and a :class:`Record` (what `optrace record`
writes and `optrace report` reads) holds those rows plus :class:`RecordMeta`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, NamedTuple

KERNEL_DSO = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"
# The events a record can hold, each its own sample type: what Sample.count counts for it.
EVENT_UNITS = {"cpu": "samples", "off-cpu": "nanoseconds", "wall": "nanoseconds"}
STACK_COMPLETE = "complete"  # RecordMeta.stack_quality: the outermost frame is a thread's root


@dataclass(frozen=True)
class Bounds:
    """The inclusive range a number stored in a record file must lie in (an ``Annotated`` extra).

    Numbers without one must be in ``0 .. 2**64-1`` (counts, addresses, offsets, times, frequencies):
    the record reader refuses anything else, so a hand-made ``10**400`` never reaches arithmetic."""

    low: int
    high: int


Pid = Annotated[int, Bounds(0, (1 << 32) - 1)]  # a pid_t
ExitStatus = Annotated[int, Bounds(-(1 << 31), (1 << 31) - 1)]  # negative: killed by that signal


class UserFrame(NamedTuple):
    """One user-space frame as the kernel's build-id stack map returned it.

    With ``build_id`` set, ``offset`` is a file offset inside the ELF object with that build-id (valid
    even after the process exited). Without it (the kernel fell back to a raw IP, as it does for
    anonymous memory such as JIT code), ``offset`` is the virtual address in the process.

    A named tuple, not a dataclass: every drain hashes each distinct stack's frames (to merge it with
    the stacks of earlier drains), and a frozen dataclass's ``__hash__`` is Python code: at 10,000
    samples a second that was a quarter of the recorder's CPU time.
    """

    build_id: bytes | None
    offset: int


# UserFrame.build_id of a runtime's frame (frontend/runtimes/): its offset is the frame word the runtime's BPF walker
# stored, named from the sample's process by that runtime. Not a real build-id's length, so no file's note can claim it.
RUNTIME_FRAME = b"<runtime frame>"

# Frame.kind: native code of a file, the kernel's, JIT code named by a perf map or jitdump (jitmaps/); any other
# kind is a runtime's (frontend/runtimes/registry.py): its frames are named by the runtime, and the kind is the
# OpenTelemetry profile.frame.type of such frames ("cpython", "jvm")
NATIVE, KERNEL, JIT_MAP = "native", "kernel", "jit-map"
FILE_KINDS = frozenset((NATIVE, KERNEL, JIT_MAP))


@dataclass(frozen=True)
class RawSample:
    """One kernel aggregation bucket: how often this (process, comm, stacks) was sampled."""

    pid: int
    comm: str
    user: tuple[UserFrame, ...]  # leaf first; empty for kernel threads or when the stack was lost
    kernel: tuple[int, ...]  # kernel IPs, leaf first; empty when the sample was in user space
    count: int
    time: float = 0.0  # monotonic time (seconds) of the drain that collected it
    # 0: ``user`` is as the kernel's build-id stack map gave it. Else ``user`` holds raw IPs (build_id None)
    # to be translated against the process's mappings of this epoch (see frontend/session.py).
    epoch: int = 0
    tid: int = 0  # the thread (CPU samples, off-CPU time); 0: not recorded
    # How a user stack unwound from CFI ended (bpf/unwindmaps.py UNWIND_STATUSES); "" for the kernel's
    # frame-pointer stacks.
    stop: str = ""
    # Why the stack's runtime frames stopped short (the runtime's walker statuses); "" when they did not, or the
    # process runs no runtime whose walker knows it
    runtime: str = ""
    # The id of a copy of the user stack (StackCopy) that replaces ``user`` (the leaf the kernel took) or
    # continues it (a CFI walk that stopped with ``stop`` "copied"), to be walked once the process's unwind
    # tables are known (frontend/session.py); 0: none
    copy: int = 0
    # Off-CPU time with wakers (record --wakers): the thread that woke this wait, its stacks at the wake-up
    # (count 0); None: the wait was preempted, or its waker was not seen
    waker: "RawSample | None" = None


@dataclass(frozen=True)
class StackCopy:
    """A sample's user registers and the first bytes of its stack (``stack``, from ``sp`` up), taken where the
    CFI walker could not walk it (bpf/stackcopy.c), walked in user space (frontend/unwind/stackcopy.py)."""

    ip: int
    sp: int
    bp: int
    stack: bytes
    return_address: bool = False  # ``ip`` is a return address (its row is looked up at ip - 1)
    continues: bool = False  # the copy goes on from the sample's CFI stack, else it replaces its user stack
    pid: int = 0
    epoch: int = 0  # the process's mappings epoch when it was taken (bpf/profile.c)
    exec_epoch: int = 0  # the process's epoch at its last exec (0: none seen)
    shared: bool = False  # several samples name it (a thread's stack as it began to exit): kept once walked
    # The address ranges a runtime claims in this process ([start, end)): its frames there take the runtime's
    # frames the sample's user stack holds (the runtime's copy walk); empty for other processes
    runtime_ranges: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Frame:
    """A symbolized frame. ``symbol`` is always printable: a demangled name, ``dso+0xOFFSET`` when
    the object is known but the address is not in its symbols, or ``[unknown]``."""

    symbol: str
    dso: str  # full path, or "[kernel.kallsyms]", "[vdso]", "[jit] <map or dump path>", "[unknown]"
    # NATIVE, KERNEL, JIT_MAP, or a runtime's kind: a function of its code (``symbol`` its qualified name,
    # ``dso`` its source file, ``address`` its first line, ``line`` the line the frame was running, 0: not known)
    kind: str = NATIVE
    address: int = 0  # file offset for user frames, the address for kernel and JIT frames
    resolved: bool = True  # False when `symbol` is the dso+0xOFFSET / [unknown] fallback
    build_id: str | None = None  # hex, lets a later tool symbolize again
    line: Annotated[int, Bounds(0, (1 << 31) - 1)] = 0
    # Native code of a runtime itself (the executable or library whose memory its frames were found in, as the
    # runtime tells, frontend/runtimes/): views fold such frames below a runtime frame into it
    # (frontend/report/pythonview.py)
    interpreter: bool = False

    @property
    def kernel(self) -> bool:
        return self.kind == KERNEL

    @property
    def runtime(self) -> bool:
        """A runtime's frame (a function of its code, named by the runtime), not native code's."""
        return self.kind not in FILE_KINDS


@dataclass
class Sample:
    """A symbolized stack: indices into :attr:`Record.frames`, leaf first (kernel frames, then user)."""

    pid: Pid
    comm: str
    frames: tuple[int, ...]
    count: int
    tid: Pid = 0  # 0: the event did not record the thread


@dataclass
class Wakeup:
    """Off-CPU time (``count``, nanoseconds) of a blocked stack (``frames``, as :class:`Sample`'s) joined to the
    stack of the thread that woke it at the wake-up (``waker_frames``, leaf first, kernel frames then user),
    as BCC's offwaketime joins them (record --off-cpu --wakers). ``waker_comm`` empty: no waker was seen."""

    pid: Pid
    comm: str
    frames: tuple[int, ...]
    count: int
    tid: Pid = 0
    waker_pid: Pid = 0
    waker_tid: Pid = 0
    waker_comm: str = ""
    waker_frames: tuple[int, ...] = ()


@dataclass
class CallCount:
    """Exact uprobe call counts (``optrace count`` / ``record --uprobe``)."""

    probe: str  # the SPEC as the user gave it
    binary: str
    symbol: str
    offset: int
    calls: int
    per_pid: dict[Pid, int] = field(default_factory=dict)
    comms: dict[Pid, str] = field(default_factory=dict)  # pid -> command name, for the pids in per_pid
    # Calls the kernel counted but could not give a process (its per-process maps were full): in
    # `calls`, in no per_pid entry. A counter of its own, never `calls` minus the rows: the kernel
    # maps are read one after the other, so that difference drifts while calls happen.
    unattributed: int = 0


@dataclass
class OffCpuMeta:
    """How the off-CPU time (Record.off_cpu, nanoseconds) was measured."""

    source: str  # the kernel hook, e.g. "raw tracepoint sched_switch"
    min_block_us: int  # shorter waits were left out
    states: list[str] = field(default_factory=list)  # kept task states; empty: all
    total_ns: int = 0
    short_waits: int = 0  # waits shorter than min_block_us, left out
    kernel_stacks: bool = True  # False: recorded with user stacks only
    # True (record --wall): the CPU samples were taken of the same threads, to be shown as time with it
    wall: bool = False
    every: int = 1  # N: one wait in N recorded (at random), counted N times: times are estimates
    wakers: bool = False  # record --wakers: Record.wakeups joins the waits that slept to their wakers
    # Off-CPU nanoseconds with a user stack by outcome, as RecordMeta.stack_quality counts samples
    stack_quality: dict[str, int] = field(default_factory=dict)


NAMED = "named"  # RuntimeCounts.samples: the samples with the runtime's frames


@dataclass
class RuntimeCounts:
    """What one runtime made of the samples of its processes (RecordMeta.runtimes), as stack_quality counts the
    stacks' outcomes: so a report says how much of a runtime's time it named in the runtime's terms, and why not."""

    language: str = ""  # what its code is written in, as reports say it ("Python")
    product: str = ""  # the runtime as its versions are named ("CPython": "CPython 3.11.2")

    # Samples by outcome: "named" (the runtime's frames in the stack), "native_only" (none of the runtime's
    # code in it), why a walk gave no frame of it (the walker's statuses), "refused: <reason>" (the process's
    # runtime is not one its reader knows); and "cut: <why>", the part of "named" whose frames were cut short
    samples: dict[str, int] = field(default_factory=dict)
    # The processes met: "<version> <file>" or "refused: <reason>" -> processes
    processes: dict[str, int] = field(default_factory=dict)
    # Anything else the runtime counts (frames named or why not, its walker's counters)
    other: dict[str, int] = field(default_factory=dict)


@dataclass
class RecordMeta:
    optrace_version: str
    hostname: str
    kernel: str
    started: float  # unix time
    duration_s: float
    frequency_hz: int
    event: str  # "cpu-clock" or "cycles"
    command: list[str] | None = None
    pids: list[Pid] = field(default_factory=list)
    system_wide: bool = False
    exit_status: ExitStatus | None = None
    total_samples: int = 0
    lost: dict[str, int] = field(default_factory=dict)  # reason -> count, never silently dropped
    idle_samples: int = 0  # samples of the idle task (pid 0), left out of the profile like BCC's profile
    # Samples of optrace's launchers (a `record -- CMD` child before its exec, comm "optrace-exec"; with -a
    # any optrace's): optrace's own overhead, left out of the profile and counted here (perf shows its
    # "perf-exec" as a command).
    launcher_samples: int = 0
    # Of total_samples: those taken for threads that ended between two ticks of their events, at their
    # process's next tick (events bound to the targets' threads tick every millisecond or so, a sample each
    # 1/F of a process's CPU time: bpf/profile.c's sample_due), so their stacks are another thread's
    carried_samples: int = 0
    stacks: bool = True  # False with --no-stacks: each sample keeps only its leaf frame
    # "dwarf": user stacks unwound in BPF from the files' CFI where they have it, else frame pointers;
    # "fp": frame pointers only (records from before the choice existed are "fp")
    call_graph: str = "fp"
    # Samples with a user stack by outcome: "complete" (outermost frame a thread's root), else why the
    # stack stopped (frontend/unwind/quality.py: no_cfi, expression, read_fault, depth_limit, fp_walk...)
    stack_quality: dict[str, int] = field(default_factory=dict)
    # Samples with a user stack, by how the kernel gave it: "build_id" (processes whose mappings were
    # not read yet), "raw" (IPs, turned into build-id frames from the process's mappings) or "cfi" (the
    # CFI walker's); "copied" counts those of them whose stack was also copied, to be walked in user space
    # (bpf/stackcopy.c).
    user_stacks: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Files that cost their own names, by kind (each also has a warning): "elf_refused", "elf_budget",
    # "elf_unreadable", "elf_malformed" (binaries, libraries, debug files), "jit_<reason>" (perf maps,
    # jitdumps: refused, corrupt, too many...), "jit_symbols_dropped" (entries over the symbol budget).
    file_problems: dict[str, int] = field(default_factory=dict)
    off_cpu: OffCpuMeta | None = None  # set when the record holds off-CPU time
    # What each runtime (frontend/runtimes/) made of the samples of its processes, by its name
    runtimes: dict[str, "RuntimeCounts"] = field(default_factory=dict)
    # The BPF programs the recording loaded, by their sources ("stackstore.c+profile.c+unwind.c"), and how:
    # "stored" (from the program cache, no compiler before the first sample), "compiled" (and stored for
    # the next runs) or "compiled, not stored" (bpf/programcache.py)
    bpf_programs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceLine:
    """From ``offset`` in a function's code on, the code is of this source line (``.debug_line``)."""

    offset: int
    file: str
    line: int


@dataclass
class FunctionCode:
    """One hot function's machine code and where its own samples landed, kept by `record` so that
    `optrace annotate` needs neither root nor the binary (which may be rebuilt, deleted, or JIT code).

    ``start`` is the address ``code[0]`` is shown at: the link-time virtual address for ELF objects (as
    perf annotate shows it), the process's address for JIT code. ``hits`` maps an offset into ``code`` to
    the samples whose leaf IP was there; a reader checks every offset against ``len(code)``."""

    symbol: str
    dso: str
    start: int
    code: bytes
    hits: dict[int, int] = field(default_factory=dict)
    build_id: str | None = None
    pid: Pid = 0  # the process whose samples ``hits`` counts (one entry per process and function)
    arch: str = "x86_64"
    truncated: bool = False  # the function is longer than the bytes kept (hits past them are not in ``hits``)
    lines: list[SourceLine] = field(default_factory=list)  # by offset, where `record` found .debug_line


@dataclass
class RuntimeSource:
    """One hot function of a runtime's code: its source lines and the samples each line had, kept by `record` so
    that `optrace annotate` shows them without the file (which may change, or be another machine's).

    ``hits`` maps a line number to the samples whose innermost runtime frame was on that line (the time of
    the native code it called included, as py-spy counts a line); ``text`` holds lines ``first_line`` onwards
    (a reader checks every hit against them)."""

    symbol: str
    file: str
    first_line: Annotated[int, Bounds(0, (1 << 31) - 1)]
    text: list[str] = field(default_factory=list)
    hits: dict[int, int] = field(default_factory=dict)
    pid: Pid = 0
    truncated: bool = False  # the function's later lines were not kept


@dataclass
class Record:
    meta: RecordMeta
    frames: list[Frame] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    calls: list[CallCount] = field(default_factory=list)
    off_cpu: list[Sample] = field(default_factory=list)  # count: nanoseconds off CPU (record --off-cpu)
    wakeups: list[Wakeup] = field(default_factory=list)  # the waits that slept, with their wakers (--wakers)
    # None: recorded before optrace kept code (annotate then says to record again); else the hottest
    # functions' code, bounded (frontend/codecapture.py)
    functions: list[FunctionCode] | None = None
    # The hottest runtime functions' source lines (frontend/runtimes/); empty in older records
    sources: list[RuntimeSource] = field(default_factory=list)
