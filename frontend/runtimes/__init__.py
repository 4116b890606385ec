"""Runtimes read from the outside (no agent, no flag): what a process's runtime (its interpreter or its JIT)
keeps in its own memory, read to name the frames of its code. One package per runtime (cpython/, hotspot/)
behind one interface (docs/runtimes.md)."""
