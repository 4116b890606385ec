"""Symbolization: raw stacks (build-id + file offset, raw addresses, kernel IPs) -> named frames.

Modules follow perf's nouns, one each: ``machine`` (what is known about the host and its processes),
``maps`` (a process's mappings), ``dso`` (one ELF object), ``symbol`` (its function symbols),
``debuginfo`` (separate debug files, MiniDebugInfo), ``kallsyms`` (kernel), ``vdso``, ``linker``
(DT_NEEDED resolution), ``buildid``, ``demangle``, and two readers of call-frame information: ``cfi`` (which
the unwinder reads too) and ``fderanges`` (the functions of code without symbols); :class:`Symbolizer` is the
entry point.
"""
from optrace.frontend.symbols.kallsyms import Kallsyms
from optrace.frontend.symbols.symbolizer import Symbolizer

__all__ = ["Kallsyms", "Symbolizer"]
