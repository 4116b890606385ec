"""Address reuse through the agent API: code A runs at an address, then code B replaces it there.

Machine code (x86-64 counting loops) is copied into one anonymous RWX page and called through ctypes;
each version is registered with write_native_code (perf map + jitdump with its bytes) before it runs.
usage: reuse.py SECONDS_EACH [--dump-dir DIR]
"""
import argparse
import ctypes
import mmap
import time

from optrace.jitmaps.agent import open_agent

# mov %rdi,%rax; 1: dec %rax; jne 1b; ret      /  the same with a nop in the loop
CODE_A = bytes([0x48, 0x89, 0xF8, 0x48, 0xFF, 0xC8, 0x75, 0xFB, 0xC3])
CODE_B = bytes([0x48, 0x89, 0xF8, 0x90, 0x48, 0xFF, 0xC8, 0x75, 0xFA, 0xC3])


def run(page: mmap.mmap, address: int, code: bytes, seconds: float) -> None:
    page.seek(0)
    page.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)(address)
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        fn(300_000)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", type=float)
    parser.add_argument("--dump-dir")
    args = parser.parse_args()
    # MAP_PRIVATE: a shared anonymous mapping would show as "/dev/zero (deleted)" in /proc/PID/maps
    page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    with open_agent(dump_dir=args.dump_dir) as agent:
        agent.write_native_code("reuse_code_A", address, len(CODE_A), CODE_A)
        print(f"0x{address:x} {agent.jitdump_path}", flush=True)
        run(page, address, CODE_A, args.seconds)
        agent.unload_native_code(address)
        agent.write_native_code("reuse_code_B", address, len(CODE_B), CODE_B)
        run(page, address, CODE_B, args.seconds)


if __name__ == "__main__":
    main()
