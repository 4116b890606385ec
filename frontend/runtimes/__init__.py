"""Runtimes read from the outside (no agent, no flag): what a process's runtime (its interpreter or its JIT)
keeps in its own memory, read to name the frames of its code. HotSpot lives here (hotspot/); CPython
(frontend/python/) moves here with the runtime seam (docs/runtimes.md)."""
