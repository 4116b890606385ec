"""The sampling defaults every way of sampling shares: record, top and serve (their options and their flags,
frontend/cliopts.py), the profiling session and the BPF profiler. One place for each, so that a default
changed here is changed everywhere."""
from __future__ import annotations

DEFAULT_FREQUENCY_HZ = 99  # samples per second per CPU (-F)
# How user stacks are walked: "dwarf" unwinds them in BPF from the files' CFI (frame pointers where there is
# none, as in JIT code); "fp" is the kernel's frame-pointer walk only (SessionOptions.call_graph).
CALL_GRAPHS = ("dwarf", "fp")
DEFAULT_CALL_GRAPH = "dwarf"
