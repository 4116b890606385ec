"""Registers functions through optrace's agent API, prints "ready", then waits for stdin to close.

usage: agent_child.py DUMP_DIR NAME:HEXADDR:HEXSIZE ...   (DUMP_DIR "-" for no jitdump)
"""
import sys

from optrace.jitmaps.agent import open_agent

dump_dir = sys.argv[1]
agent = open_agent(dump_dir=None if dump_dir == "-" else dump_dir, jitdump=dump_dir != "-")
for spec in sys.argv[2:]:
    name, addr, size = spec.split(":")
    agent.write_native_code(name, int(addr, 16), int(size, 16))
print("ready", agent.jitdump_path, flush=True)
sys.stdin.read()
agent.close()
