"""Loading a BPF program through BCC: the one place that imports bcc and compiles C."""
from __future__ import annotations

from optrace.errors import OptraceError
from optrace.heap import release_free_memory


def import_bcc():
    try:
        import bcc
    except ImportError as exc:
        raise OptraceError("BCC is not importable (Debian package python3-bpfcc): run sudo make setup") from exc
    return bcc


def counter_increments(table, reasons: tuple[str, ...], seen: list[int]) -> dict[str, int]:
    """What a per-CPU array of counters (index i counts ``reasons[i]``) added since the last call, whose
    totals ``seen`` holds (updated here): the counters themselves only grow."""
    delta = {}
    for i, reason in enumerate(reasons):
        total = sum(table[table.Key(i)])
        if total > seen[i]:
            delta[reason] = total - seen[i]
        seen[i] = total
    return delta


def load_bcc(**kwargs):
    """``bcc.BPF(**kwargs)``, with BCC's absence or a failed compile as an OptraceError.

    Clang and LLVM free what the compile took (about 60 MB here), but glibc keeps freed heap
    mapped: it is handed back to the system at once, so a long-running `optrace serve` does not
    carry the compile's memory for its whole life."""
    bcc = import_bcc()
    try:
        program = bcc.BPF(**kwargs)
    except Exception as exc:
        raise OptraceError(f"cannot load the BPF program: {exc} (optrace doctor tells what is missing)") from exc
    release_free_memory()
    return program
