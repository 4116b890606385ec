"""Finding a process's CPython interpreter: which mapped file holds ``_PyRuntime``, its version, the layout
the walker needs (the hand-kept table for 3.8-3.12, the interpreter's own ``_Py_DebugOffsets`` for 3.13+),
and a live check of that layout against the process before it is used.

This runs for every new process that maps a file named like an interpreter, so the name is tested first
(nothing is opened for other processes), and what comes from the file is cached per file
(:mod:`~optrace.frontend.runtimes.cpython.interpreterfile`); what remains per process is a few memory reads.

The process's memory is its own to fake (a binary named python3.11 with a garbage ``_PyRuntime``): the
check follows ``_PyRuntime.interpreters.head`` to the interpreter, its first thread state, and that
thread state's ``interp`` back to the interpreter; anything else is refused as "layout check failed".
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable

from optrace.frontend.runtimes.cpython.debugoffsets import READ_SIZE, parse_debug_offsets, version_of_hex
from optrace.frontend.runtimes.cpython.interpreterfile import EVAL, InterpreterFile, interpreter_file
from optrace.frontend.runtimes.cpython.layouts import (NEWEST_IN_TABLE, ThreadOffsets, table_layout, table_thread_offsets,
                                             unsupported)
from optrace.frontend.runtimes.cpython.memory import ProcessMemory
from optrace.procfs import MapEntry
from optrace.pythonlayout import PythonLayout, PythonProcess

# python3.11, python3.6m, libpython3.11.so.1.0, libpython3.7m.so, python3.13t (its flag refuses it later)
INTERPRETER_NAME = re.compile(r"^(?:lib)?python(\d+)\.(\d+)[a-z]*(?:\.so(?:\.\d+)*)?$")
NOT_STARTED = "interpreter not initialized"
CHECK_FAILED = "layout check failed"
NO_RUNTIME = "no _PyRuntime"
UNREADABLE = "cannot read _PyRuntime"  # the process is gone, or its memory is not ours to read
RELEASE_LEVELS = {0xA: "a", 0xB: "b", 0xC: "rc", 0xF: ""}


def python_mappings(maps: Iterable[MapEntry]) -> list[tuple[MapEntry, tuple[int, int]]]:
    """The executable file mappings named like an interpreter, one per file, with the version the name says."""
    found: dict[tuple[str, int], tuple[MapEntry, tuple[int, int]]] = {}
    for entry in maps:
        if not (entry.is_file and entry.executable) or entry.file_key in found:
            continue
        match = INTERPRETER_NAME.match(os.path.basename(entry.file_path))
        if match:
            found[entry.file_key] = (entry, (int(match.group(1)), int(match.group(2))))
    return list(found.values())


def find_interpreter(pid: int, maps: Iterable[MapEntry]) -> PythonProcess | str:
    """The interpreter of process ``pid`` (``maps``: its executable file mappings, optrace.procfs), or a short
    reason why there is none to walk ("no python file mapped", "python 3.7 not supported", "no _PyRuntime",
    "free-threaded build", "interpreter not initialized" (try again later), "layout check failed",
    "cannot read _PyRuntime", ...)."""
    reasons = []
    memory = ProcessMemory(pid)
    for entry, named in python_mappings(maps):
        found = _from_mapping(pid, entry, named, memory)
        if isinstance(found, PythonProcess):
            return found
        reasons.append(found)
    if not reasons:
        return "no python file mapped"
    return next((reason for reason in reasons if reason != NO_RUNTIME), reasons[0])


def _from_mapping(pid: int, entry: MapEntry, named: tuple[int, int], memory: ProcessMemory) -> PythonProcess | str:
    refused = unsupported(named)
    if refused:
        return refused
    facts = interpreter_file(pid, entry)
    if isinstance(facts, str):
        return facts
    if facts.runtime is None:
        return NO_RUNTIME
    text = _file_version(facts, named)
    if text is None:
        return f"file named python {named[0]}.{named[1]} says {version_text(facts.py_version or 0)}"
    if not facts.eval_ranges:
        return f"no {EVAL} with a size"
    bias = facts.bias(entry)
    runtime = facts.runtime + bias
    found = layout_of(memory, runtime, named)
    if isinstance(found, str):
        return found
    layout, threads = found
    problem = check_layout(memory, runtime, layout, threads)
    if problem:
        return problem
    eval_ranges = tuple((start + bias, end + bias) for start, end in facts.eval_ranges)
    return PythonProcess(pid=pid, version=text, path=entry.file_path, runtime=runtime, eval_ranges=eval_ranges,
                         layout=layout)


def _file_version(facts: InterpreterFile, named: tuple[int, int]) -> str | None:
    """The version as text: Py_Version's (which every 3.11+ file exports), else the name's "3.X"; None when
    Py_Version contradicts the name (or a 3.11+ file has none)."""
    if facts.py_version is None:
        return None if named >= (3, 11) else f"{named[0]}.{named[1]}"
    return version_text(facts.py_version) if version_of_hex(facts.py_version)[:2] == named else None


def layout_of(memory: ProcessMemory, runtime: int,
              version: tuple[int, int]) -> tuple[PythonLayout, ThreadOffsets] | str:
    """(layout, thread offsets) of an interpreter of ``version`` whose _PyRuntime is at ``runtime``."""
    if version <= NEWEST_IN_TABLE:
        layout, threads = table_layout(version), table_thread_offsets(version)
        return (layout, threads) if layout and threads else f"python {version[0]}.{version[1]} not supported"
    data = memory.read(runtime, READ_SIZE)
    if not data:
        return UNREADABLE
    parsed = parse_debug_offsets(data, version)
    return parsed if isinstance(parsed, str) else (parsed.layout, parsed.threads)


def version_text(version_hex: int) -> str:
    """"3.13.0", "3.14.0b1" from PY_VERSION_HEX."""
    major, minor, micro = version_of_hex(version_hex)
    level = RELEASE_LEVELS.get(version_hex >> 4 & 0xF, "?")
    return f"{major}.{minor}.{micro}{level}{version_hex & 0xF if level else ''}"


def check_layout(memory: ProcessMemory, runtime: int, layout: PythonLayout, threads: ThreadOffsets) -> str | None:
    """None when _PyRuntime.interpreters.head leads to an interpreter whose first thread state points back to
    it; NOT_STARTED before the interpreter has one; UNREADABLE or CHECK_FAILED otherwise."""
    head = memory.pointer(runtime + layout.interpreters_head)
    if head is None:
        return UNREADABLE
    if head == 0:
        return NOT_STARTED
    tstate = memory.pointer(head + layout.interp_threads_head)
    if tstate == 0:
        return NOT_STARTED
    back = memory.pointer(tstate + threads.tstate_interp) if tstate is not None else None
    return None if back is not None and back == head else CHECK_FAILED


def thread_offsets(process: PythonProcess, memory: ProcessMemory | None = None) -> ThreadOffsets | None:
    """The thread-state offsets beyond the contract (the table's, or the process's debug offsets again)."""
    version = process.layout.version
    if version <= NEWEST_IN_TABLE:
        return table_thread_offsets(version)
    memory = memory or ProcessMemory(process.pid)
    parsed = parse_debug_offsets(memory.read(process.runtime, READ_SIZE), version)
    return None if isinstance(parsed, str) else parsed.threads
