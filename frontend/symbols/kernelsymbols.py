"""/proc/kallsyms loaded on a thread of its own while a session starts sampling (see
:class:`KernelSymbolsLoader`)."""
from __future__ import annotations

import threading


class KernelSymbolsLoader:
    """/proc/kallsyms loaded (its table read back when stored, see kallsyms.py) in a thread started now,
    handed to the symbolizer when it first names samples; a failure becomes the symbolizer's own warning
    (it loads them again itself). A session starts it once the sampler is attached: before, it would only
    compete with the way to the first sample (0.066 s of CPU for a stored table, 0.13-0.16 s parsed)."""

    def __init__(self) -> None:
        self._table = None
        self._thread: threading.Thread | None = threading.Thread(target=self._load, name="kallsyms", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        from optrace.frontend.symbols.kallsyms import Kallsyms, stored_symbols

        stored = None
        try:
            stored = stored_symbols()
            self._table = Kallsyms.load(stored=stored)
        except Exception:  # the symbolizer's own load gives the warning
            self._table = None
        finally:
            if stored is not None:
                stored.close()

    def hand_to(self, symbolizer) -> None:
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        if self._table is not None:
            symbolizer.use_kernel_symbols(self._table)
            self._table = None
