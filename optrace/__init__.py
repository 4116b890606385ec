"""optrace: an eBPF CPU profiler and uprobe call counter with JIT symbol support."""

__version__ = "0.1.0"
