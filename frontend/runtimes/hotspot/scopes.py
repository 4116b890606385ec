"""The methods a compiled frame was running, inlined ones expanded: the nmethod's debug information read from
the outside, as the VM's ScopeDesc decodes it.

An nmethod keeps a table of PcDescs (pc offset from its code's start, scope decode offset) and a stream of
scopes: each scope is (sender's decode offset, metadata index of its Method*, bci + 1) in UNSIGNED5, the
sender being the method this one was inlined into, 0 ending the chain. The pc of a caller's frame (a return
address) has its own PcDesc; a leaf's pc between two takes the next one (the state the code was going to).

Everything is the process's: each part at most MAX_REGION bytes, a chain at most MAX_SCOPES scopes, each
decode offset must lie before the one that led to it (so a chain cannot loop).
"""
from __future__ import annotations

from dataclasses import dataclass

from optrace.frontend.runtimes.hotspot.codecache import CodeBlob
from optrace.frontend.runtimes.hotspot.layout import Bound, HotSpotLayout
from optrace.frontend.runtimes.hotspot.unsigned5 import Stream
from optrace.frontend.runtimes.hotspot.values import value
from optrace.frontend.runtimes.hotspot.vmstructs import Memory

MAX_REGION = 1 << 18  # bytes of one part (metadata, scopes, PcDescs): real nmethods have a few KiB
MAX_SCOPES = 64  # the VM inlines 15 deep by default (MaxInlineLevel)
SERIALIZED_NULL = 0
INVOCATION_ENTRY_BCI = -1


@dataclass(frozen=True)
class DebugInfo:
    metadata: bytes
    pcs: tuple[tuple[int, int], ...]  # (pc offset, scope decode offset), as the table holds them
    scopes: bytes


@dataclass(frozen=True)
class Scope:
    method: int  # Method*
    bci: int


def debug_info(memory: Memory, layout: HotSpotLayout, blob: CodeBlob) -> DebugInfo | str:
    regions = {}
    for part, (start, end) in layout.nmethod_data.items():
        low, high = _address(layout, blob, start), _address(layout, blob, end)
        if low is None or high is None or not 0 <= high - low <= MAX_REGION:
            return f"bad nmethod {part}"
        data = memory.read_exact(low, high - low) if high > low else b""
        if data is None:
            return f"nmethod {part} unreadable"
        regions[part] = data
    size = layout.sizes["pc_desc"]
    pc_at, scope_at = layout.field("pc_desc_pc_offset"), layout.field("pc_desc_scope_offset")
    table = regions["scopes_pcs"]
    pcs = tuple((value(table[i:i + size], pc_at, signed=True), value(table[i:i + size], scope_at, signed=True))
                for i in range(0, len(table) - size + 1, size) if size > 0)
    if any(None in pair for pair in pcs):
        return "bad PcDesc table"
    return DebugInfo(regions["metadata"], pcs, regions["scopes_data"])


def _address(layout: HotSpotLayout, blob: CodeBlob, bound: Bound) -> int | None:
    held = value(blob.header, bound.field, signed=bound.base != "absolute")
    if held is None:
        return None
    if bound.base == "absolute":
        return held
    base = blob.address if bound.base == "blob" else value(blob.header, layout.nmethod_bases[bound.base])
    return None if not base else base + held


def scopes_at(info: DebugInfo, pc_offset: int, return_address: bool, excluded: int) -> list[Scope] | str:
    """The scopes at ``pc_offset`` from the code's start, innermost first (empty: no debug information)."""
    decode = _decode_offset(info.pcs, pc_offset, return_address)
    scopes: list[Scope] = []
    limit = len(info.scopes)
    while decode not in (None, SERIALIZED_NULL) and len(scopes) < MAX_SCOPES:
        if not 0 < decode < limit:
            return f"scope offset {decode} outside the scopes"
        stream = Stream(info.scopes, excluded, decode)
        sender, index, bci = stream.uint(), stream.uint(), stream.uint()
        if sender is None or index is None or bci is None:
            return "scope unreadable"
        method = _metadata(info.metadata, index)
        if method is None:
            return f"metadata index {index} outside the metadata"
        scopes.append(Scope(method, bci + INVOCATION_ENTRY_BCI))
        limit, decode = decode, sender
    return scopes


def _decode_offset(pcs: tuple[tuple[int, int], ...], pc_offset: int, return_address: bool) -> int | None:
    """The scope of a return address's own PcDesc, else of the first PcDesc at or after the pc."""
    following = None
    for at, scope in pcs:
        if at == pc_offset:
            return scope
        if not return_address and at > pc_offset and (following is None or at < following[0]):
            following = (at, scope)
    return following[1] if following else None


def _metadata(metadata: bytes, index: int) -> int | None:
    """metadata_at(index): 0 is null, else entry index - 1 of the nmethod's metadata array."""
    if index == 0 or 8 * index > len(metadata):
        return None
    return int.from_bytes(metadata[8 * (index - 1):8 * index], "little")
