"""A real JIT: compiles `optrace_jit_hot` with llvmlite (MCJIT), registers it through optrace's agent API
(perf map + jitdump with the code bytes), then burns CPU in it for the given seconds.

usage: llvm_jit.py SECONDS [--dump-dir DIR] [--no-perf-map] [--no-jitdump] [--wait] [--cpu]

--wait: print "ready" once llvmlite is loaded and compile only after a line on stdin (a test sets its
profiler up meanwhile); --cpu: SECONDS of this process's CPU time, not wall time (the loop's share of
its samples then does not depend on the machine's load).
"""
from __future__ import annotations

import argparse
import ctypes
import io
import sys
import time

import llvmlite.binding as llvm
from elftools.elf.elffile import ELFFile

from optrace.jitmaps.agent import DebugLine, open_agent

NAME = "optrace_jit_hot"
IR = f"""
define i64 @{NAME}(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]
  %acc = phi i64 [ 1, %entry ], [ %acc.next, %loop ]
  %mul = mul i64 %acc, 1103515245
  %acc.next = add i64 %mul, 12345
  %i.next = add i64 %i, 1
  %done = icmp eq i64 %i.next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret i64 %acc.next
}}
"""


def compile_hot() -> tuple[object, int, int]:
    """(engine, address, size): the size comes from the object file's symbol table."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
    module = llvm.parse_assembly(IR)
    module.verify()
    obj = ELFFile(io.BytesIO(machine.emit_object(module)))
    size = next(s["st_size"] for s in obj.get_section_by_name(".symtab").iter_symbols() if s.name == NAME)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return engine, engine.get_function_address(NAME), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", type=float)
    parser.add_argument("--dump-dir")
    parser.add_argument("--no-perf-map", action="store_true")
    parser.add_argument("--no-jitdump", action="store_true")
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    if args.wait:
        print("ready", flush=True)
        sys.stdin.readline()
    clock = time.process_time if args.cpu else time.monotonic
    engine, address, size = compile_hot()
    with open_agent(dump_dir=args.dump_dir, perf_map=not args.no_perf_map, jitdump=not args.no_jitdump) as agent:
        agent.write_debug_line_info(address, [DebugLine(address, 1, "hot.ll")])
        agent.write_native_code(NAME, address, size, ctypes.string_at(address, size))
        print(f"{NAME} 0x{address:x} {size} {agent.jitdump_path}", flush=True)
        hot = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(address)
        deadline = clock() + args.seconds
        while clock() < deadline:
            hot(2_000_000)
    sys.exit(0)


if __name__ == "__main__":
    main()
