"""Stored snapshots of HotSpot JVMs (JDK 17, 25) for replays of the Java walk: one stopped thread's registers,
the pages of the JVM's memory that reading its tables and walking its Java frames read, and where libjvm's
``gHotSpot*`` symbols were; the frames the walk gave when it was made.

Until the BPF walker of HotSpot frames exists (docs/runtimes.md), the walk replayed is the user-space reference
walk (frontend/runtimes/hotspot/walker.py), the rules that walker will follow; the layout is derived again from
the stored tables, so a field off by one fails. make_java_snapshot.py makes them from live JVMs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from optrace.frontend.runtimes.hotspot.layout import HotSpotLayout
from optrace.frontend.runtimes.hotspot.process import HotSpotProcess, JavaFrame, attach_tables
from optrace.frontend.runtimes.hotspot.walker import JavaStack, Registers, java_stack
from snapshots import SNAPSHOTS, SnapshotMemory, read_pages, write_pages

FORMAT = 1


@dataclass(frozen=True)
class JavaSnapshot:
    name: str
    about: dict
    registers: dict[str, int]  # ip, sp, bp, r13
    tid: int
    symbols: dict[str, int]  # libjvm's gHotSpot* symbols (link-time addresses)
    bias: int
    pages: dict[int, bytes]
    expected: tuple[JavaFrame, ...]
    status: str
    from_anchor: bool
    upcalls: int


def process_of(snapshot: JavaSnapshot, layout: HotSpotLayout | None = None) -> HotSpotProcess:
    """The JVM as attach finds it from the snapshot's memory, or with ``layout`` instead of the one derived."""
    memory = SnapshotMemory(snapshot.pages)
    found = attach_tables(0, memory, snapshot.symbols, snapshot.bias, ("snapshot", snapshot.name))
    if isinstance(found, str):
        raise AssertionError(f"{snapshot.name}: {found}")
    if layout is None:
        return found
    return HotSpotProcess(0, memory, snapshot.bias, found.structs, layout, found.major, found.release)


def replay_java(snapshot: JavaSnapshot, layout: HotSpotLayout | None = None) -> JavaStack:
    regs = snapshot.registers
    return java_stack(process_of(snapshot, layout), Registers(regs["ip"], regs["sp"], regs["bp"], regs["r13"]),
                      snapshot.tid)


def save_java(snapshot: JavaSnapshot, folder: Path = SNAPSHOTS) -> Path:
    meta = {"format": FORMAT, "about": snapshot.about, "registers": {k: hex(v) for k, v in snapshot.registers.items()},
            "tid": snapshot.tid, "symbols": {k: hex(v) for k, v in snapshot.symbols.items()}, "bias": hex(snapshot.bias),
            "status": snapshot.status, "from_anchor": snapshot.from_anchor,
            "upcalls": snapshot.upcalls, "expected": [frame.__dict__ for frame in snapshot.expected],
            "pages": write_pages(folder, snapshot.name, snapshot.pages)}
    path = folder / f"{snapshot.name}.json"
    path.write_text(json.dumps(meta, indent=1) + "\n")
    return path


def load_java(name: str, folder: Path = SNAPSHOTS) -> JavaSnapshot:
    meta = json.loads((folder / f"{name}.json").read_text())
    if meta["format"] != FORMAT:
        raise AssertionError(f"{name}: snapshot format {meta['format']}, this harness reads {FORMAT}")
    return JavaSnapshot(name, meta["about"], {k: int(v, 16) for k, v in meta["registers"].items()}, meta["tid"],
                        {k: int(v, 16) for k, v in meta["symbols"].items()}, int(meta["bias"], 16),
                        read_pages(folder, name, meta["pages"]), tuple(JavaFrame(**f) for f in meta["expected"]),
                        meta["status"], meta["from_anchor"], meta["upcalls"])

