"""Fields of the VM's structures read out of bytes taken from its memory (one read per structure), with the
widths the VM's tables state (layout.py). Out-of-range fields read as None: the bytes are the process's."""
from __future__ import annotations

from optrace.frontend.runtimes.hotspot.layout import Field


def value(data: bytes | None, field: Field, signed: bool = False) -> int | None:
    """The field's value in ``data`` (a structure's bytes from its start), None when they do not reach it."""
    if data is None or field.offset < 0 or field.offset + field.width > len(data):
        return None
    return int.from_bytes(data[field.offset:field.offset + field.width], "little", signed=signed)


def location(data: bytes | None, field: Field, start: int) -> int | None:
    """An address the structure at ``start`` holds in ``field``: the pointer itself, or ``start`` plus the
    offset the field holds (a JDK 23+ CodeBlob keeps offsets where older ones kept pointers)."""
    found = value(data, field, signed=field.relative)
    if found is None:
        return None
    return (start + found) & ((1 << 64) - 1) if field.relative else found
