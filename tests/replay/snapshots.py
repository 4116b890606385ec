"""Stored snapshots of processes for the replay (replay.py): the registers of one stopped thread, the pages of
its memory the walk read, its executable mappings with the unwind rows the walk looked at, what the process's
runtime was found to be, and the stack the walk gave when the snapshot was made, named.

A snapshot is ``NAME.json`` (everything but the memory) and ``NAME.pages.xz`` (the pages, 4 KiB each, in the
order the JSON lists them), under snapshots/. The process's threads (their kernel tids, from /proc, and which
one was stopped) are kept too: the interpreter's thread list read from the pages must be them. tests/replay/make_snapshot.py makes the Python ones from live
processes (javasnapshots.py holds the Java ones).

What is stored is raw facts, not the layouts the code derives from them: a replay derives the interpreter's
layout again (the table for 3.8-3.12, the process's own ``_Py_DebugOffsets`` from its pages for 3.13+) and
packs the maps with today's code, so a layout or packing off by one fails the replay.
"""
from __future__ import annotations

import json
import lzma
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from optrace.frontend.runtimes.cpython.codeobject import CodeInfo, decode_capture, read_code
from optrace.frontend.runtimes.cpython.interpreter import check_layout, layout_of
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.frontend.runtimes.cpython.walker import thread_states
from optrace.frontend.unwind.row import ROW
from optrace.pythonlayout import PythonLayout, PythonProcess, is_python_frame, python_frame_parts

SNAPSHOTS = Path(__file__).with_name("snapshots")
PAGE = 4096
FORMAT = 2  # 2: the process's threads (tid, tids)
FILE_FRAME = 1 << 63
FILE_OFFSET_BITS = 40


@dataclass(frozen=True)
class Frame:
    """A frame of a replayed stack as tests compare it: Python frames by name (the qualified name frames show,
    and co_name), file, line and instruction; native frames by file and file offset (``symbol`` is for people
    reading the snapshot; it is not compared)."""

    kind: str  # "python", "native" (a file frame), "raw" (an address outside any file with a build-id)
    name: str = ""
    file: str = ""
    line: int = 0
    offset: int = 0
    symbol: str = field(default="", compare=False)
    function: str = ""  # co_name
    instr: int = 0  # the frame word's instruction (code units)

    def to_json(self) -> dict:
        if self.kind == "python":
            return {"kind": "python", "name": self.name, "function": self.function, "file": self.file,
                    "line": self.line, "instr": self.instr}
        return {"kind": self.kind, "file": self.file, "offset": hex(self.offset), "symbol": self.symbol}

    @staticmethod
    def from_json(data: dict) -> "Frame":
        if data["kind"] == "python":
            return Frame("python", data["name"], data["file"], data["line"], function=data["function"],
                         instr=data["instr"])
        return Frame(data["kind"], file=data["file"], offset=int(data["offset"], 16), symbol=data.get("symbol", ""))

    def __str__(self) -> str:
        if self.kind == "python":
            return f"{self.name} ({self.file}:{self.line})"
        return f"{self.symbol or '?'} ({self.file}+{self.offset:#x})"


@dataclass(frozen=True)
class SnapshotMapping:
    start: int
    end: int
    file_offset: int
    bias: int
    file: str  # the file's base name
    file_id: int  # as the walker's frames name it (0: none, the frames are raw addresses)
    rows: tuple[tuple[int, int, int, int, int], ...]  # (pc, cfa_type, cfa_offset, rbp_type, rbp_offset)

    def packed_rows(self) -> bytes:
        """The rows as struct unwind_row (frontend/unwind/row.py's ROW)."""
        return b"".join(ROW.pack(pc, cfa_offset, rbp_offset, cfa_type, rbp_type)
                        for pc, cfa_type, cfa_offset, rbp_type, rbp_offset in self.rows)


@dataclass(frozen=True)
class Snapshot:
    name: str
    about: dict  # how and from what it was made
    registers: dict[str, int]  # ip, sp, bp, fs_base
    python: dict  # version, minor, path, runtime, eval_ranges
    mappings: tuple[SnapshotMapping, ...]
    pages: dict[int, bytes]
    expected: tuple[Frame, ...]  # leaf first
    status: str
    python_status: str
    tid: int  # the stopped thread's kernel tid
    tids: tuple[int, ...]  # the process's threads (/proc/PID/task) when it was stopped

    def regions(self) -> list[tuple[int, bytes]]:
        """The pages as memory regions (adjacent pages joined)."""
        regions: list[tuple[int, bytes]] = []
        for address in sorted(self.pages):
            if regions and regions[-1][0] + len(regions[-1][1]) == address:
                regions[-1] = (regions[-1][0], regions[-1][1] + self.pages[address])
            else:
                regions.append((address, self.pages[address]))
        return regions

    def memory(self) -> "SnapshotMemory":
        return SnapshotMemory(self.pages)

    def python_process(self, layout: PythonLayout | None = None) -> PythonProcess:
        """The interpreter as frontend/runtimes/cpython/ finds it from the snapshot's memory (its layout derived again,
        and checked as for a live process), or with ``layout`` given."""
        runtime, minor = self.python["runtime"], tuple(self.python["minor"])
        if layout is None:
            found = layout_of(self.memory(), runtime, minor)
            if isinstance(found, str):
                raise AssertionError(f"{self.name}: no layout from the snapshot: {found}")
            layout, threads = found
            problem = check_layout(self.memory(), runtime, layout, threads)
            if problem:
                raise AssertionError(f"{self.name}: {problem}")
        return PythonProcess(pid=0, version=self.python["version"], path=self.python["path"], runtime=runtime,
                             eval_ranges=tuple(tuple(r) for r in self.python["eval_ranges"]), layout=layout)


class SnapshotMemory(ProcessMemory):
    """The snapshot's pages read as frontend/runtimes/cpython/memory.py's ProcessMemory reads a live process."""

    def __init__(self, pages: dict[int, bytes]) -> None:
        super().__init__(0)
        self._pages = pages

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self._read(address, size) for address, size in ranges]

    def _read(self, address: int, size: int) -> bytes:
        out = bytearray()
        while len(out) < size:
            page = self._pages.get((address + len(out)) & ~(PAGE - 1))
            if page is None:
                break
            at = (address + len(out)) % PAGE
            out += page[at:at + size - len(out)]
        return bytes(out)


class LoggedMemory(ProcessMemory):
    """A live process's memory that keeps the pages it was asked for: what a snapshot of the reads made
    through it must hold."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.pages: set[int] = set()

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        for address, size in ranges:
            if 0 < address < 1 << 64:
                self.pages.update(range(address & ~(PAGE - 1), address + max(size, 1), PAGE))
        return super().read_ranges(ranges)

    def page_bytes(self) -> dict[int, bytes]:
        """The pages asked for, as they are now (those that cannot be read left out)."""
        found = {page: self.read_exact(page, PAGE) for page in sorted(self.pages)}
        return {page: data for page, data in found.items() if data is not None}


def named_frames(words: Sequence[int], captures: Sequence[bytes], layout: PythonLayout,
                 mappings: Sequence[SnapshotMapping], memory, symbols: dict[tuple[str, int], str] | None = None
                 ) -> tuple[Frame, ...]:
    """The frames of a replayed stack: Python frames named as frontend/runtimes/cpython/ names them, from the walker's
    captures, else (a code object beyond the sample's captures) read from the process's ``memory``; file
    frames by the mapping with their file id."""
    infos: dict[int, CodeInfo | None] = {}
    for capture in captures:
        code = struct.unpack_from("<IIQ", capture)[2]
        infos[code] = decode_capture(capture, layout)
    for word in words:
        code = python_frame_parts(word)[0] if is_python_frame(word) else None
        if code is not None and code not in infos:
            infos[code] = read_code(0, code, layout, memory)
    files = {m.file_id: m.file for m in mappings if m.file_id}
    frames = []
    for word in words:
        if is_python_frame(word):
            code, instr = python_frame_parts(word)
            info = infos.get(code)
            frames.append(Frame("python", info.qualname if info else "[unnamed]",
                                Path(info.filename).name if info else "", info.line(instr) if info else 0,
                                function=info.name if info else "", instr=instr))
        elif word & FILE_FRAME:
            file_id, offset = (word >> FILE_OFFSET_BITS) & ((1 << 23) - 1), word & ((1 << FILE_OFFSET_BITS) - 1)
            file = files.get(file_id, f"[file {file_id}]")
            frames.append(Frame("native", file=file, offset=offset, symbol=(symbols or {}).get((file, offset), "")))
        else:
            frames.append(Frame("raw", offset=word))
    return tuple(frames)


def write_pages(folder: Path, name: str, pages: dict[int, bytes]) -> list[str]:
    """Stores the pages as NAME.pages.xz; their addresses, in the order stored."""
    folder.mkdir(parents=True, exist_ok=True)
    order = sorted(pages)
    (folder / f"{name}.pages.xz").write_bytes(
        lzma.compress(b"".join(pages[address] for address in order), preset=9 | lzma.PRESET_EXTREME))
    return [hex(address) for address in order]


def read_pages(folder: Path, name: str, addresses: list[str]) -> dict[int, bytes]:
    data = lzma.decompress((folder / f"{name}.pages.xz").read_bytes())
    return {int(address, 16): data[i * PAGE:(i + 1) * PAGE] for i, address in enumerate(addresses)}


def save(snapshot: Snapshot, folder: Path = SNAPSHOTS) -> Path:
    meta = {
        "format": FORMAT, "about": snapshot.about, "registers": {k: hex(v) for k, v in snapshot.registers.items()},
        "python": snapshot.python, "status": snapshot.status, "python_status": snapshot.python_status,
        "expected": [frame.to_json() for frame in snapshot.expected], "tid": snapshot.tid, "tids": list(snapshot.tids),
        "mappings": [{"start": hex(m.start), "end": hex(m.end), "file_offset": hex(m.file_offset), "bias": hex(m.bias),
                      "file": m.file, "file_id": m.file_id, "rows": [list(row) for row in m.rows]}
                     for m in snapshot.mappings],
        "pages": write_pages(folder, snapshot.name, snapshot.pages),
    }
    path = folder / f"{snapshot.name}.json"
    path.write_text(json.dumps(meta, indent=1) + "\n")
    return path


def load(name: str, folder: Path = SNAPSHOTS) -> Snapshot:
    meta = json.loads((folder / f"{name}.json").read_text())
    if meta["format"] != FORMAT:
        raise AssertionError(f"{name}: snapshot format {meta['format']}, this harness reads {FORMAT}")
    pages = read_pages(folder, name, meta["pages"])
    mappings = tuple(SnapshotMapping(int(m["start"], 16), int(m["end"], 16), int(m["file_offset"], 16),
                                     int(m["bias"], 16), m["file"], m["file_id"], tuple(map(tuple, m["rows"])))
                     for m in meta["mappings"])
    return Snapshot(name, meta["about"], {k: int(v, 16) for k, v in meta["registers"].items()}, meta["python"],
                    mappings, pages, tuple(Frame.from_json(f) for f in meta["expected"]), meta["status"],
                    meta["python_status"], meta["tid"], tuple(meta["tids"]))


def names(prefix: str = "python-", folder: Path = SNAPSHOTS) -> list[str]:
    return sorted(path.name[:-len(".json")] for path in folder.glob(f"{prefix}*.json"))


def thread_problem(process: PythonProcess, memory: ProcessMemory, tid: int, pthread_id: int,
                   tids: Sequence[int]) -> str | None:
    """None when the interpreter's thread states (frontend/runtimes/cpython/walker.py's list, read from ``memory``) are
    the threads ``tids``: as many, each with its kernel tid where the version keeps one (3.11+), and the one of
    ``tid`` with ``pthread_id`` (pthread_self, the fs base the BPF walker matches); else what differs."""
    states = thread_states(process, memory)
    if len(states) != len(tids):
        return f"{len(states)} thread states, the process had {len(tids)} threads"
    if process.layout.version < (3, 11):
        return None if pthread_id in {state.thread_id for state in states} else f"no thread state of {pthread_id:#x}"
    if sorted(state.native_thread_id or 0 for state in states) != sorted(tids):
        return f"thread states of tids {[state.native_thread_id for state in states]}, the process's {list(tids)}"
    mine = next(state for state in states if state.native_thread_id == tid)
    return None if mine.thread_id == pthread_id else f"thread {tid}'s state says pthread {mine.thread_id:#x}"


def snapshot_thread_problem(snapshot: Snapshot, layout: PythonLayout | None = None) -> str | None:
    """thread_problem of the snapshot's interpreter (``layout``: as replay_snapshot's) read from its pages."""
    return thread_problem(snapshot.python_process(layout), snapshot.memory(), snapshot.tid,
                          snapshot.registers["fs_base"], snapshot.tids)


@dataclass(frozen=True)
class Replayed:
    frames: tuple[Frame, ...]
    status: str
    python_status: str


def replay_snapshot(replay, snapshot: Snapshot, layout: PythonLayout | None = None) -> Replayed:
    """The snapshot's stack as the walker (a replay.Replay) gives it now, named as frontend/runtimes/cpython/ names it;
    ``layout``: the interpreter's layout to use instead of the one derived from the snapshot."""
    from optrace.bpf.pythonmaps import python_status_name
    from optrace.bpf.unwindmaps import UNWIND_STATUSES
    from replay import ReplayMapping

    process = snapshot.python_process(layout)
    replay.reset()
    replay.set_memory(snapshot.regions())
    replay.load_process([ReplayMapping(m.start, m.end, m.file_offset, m.bias, m.file_id, m.packed_rows())
                         for m in snapshot.mappings], process)
    regs = snapshot.registers
    result = replay.sample(regs["ip"], regs["sp"], regs["bp"], regs["fs_base"])
    symbols = {(f.file, f.offset): f.symbol for f in snapshot.expected if f.kind == "native"}
    frames = named_frames(result.words, result.captures, process.layout, snapshot.mappings, snapshot.memory(), symbols)
    status = UNWIND_STATUSES[result.status] if result.status < len(UNWIND_STATUSES) else str(result.status)
    return Replayed(frames, status, python_status_name(result.python_status))
