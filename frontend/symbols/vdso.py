"""The [vdso] image. The kernel maps the same vDSO into every process, so our own copy (read from
/proc/self/mem at the [vdso] range of /proc/self/maps) names the [vdso] frames of any process."""
from __future__ import annotations

from optrace.procfs import read_maps

VDSO = "[vdso]"


def read_own_vdso() -> bytes | None:
    """The bytes of this process's vDSO, or None when there is none (or /proc/self/mem is closed)."""
    maps = read_maps("self")
    for entry in maps.entries if maps is not None else ():
        if entry.path == VDSO:
            try:
                with open("/proc/self/mem", "rb", buffering=0) as mem:
                    mem.seek(entry.start)
                    return mem.read(entry.end - entry.start)
            except OSError:
                return None
    return None
