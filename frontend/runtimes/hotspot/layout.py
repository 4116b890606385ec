"""The offsets naming HotSpot frames needs, taken from one VM's own tables (vmstructs.py), and refused, never
guessed, when they are not all there.

What differs between JDKs is data here: each field is a list of the names JDKs have given it (the first the
VM exports wins), its width comes from the C type the VM states, and where the layout of a compiled method's
debug information moved (JDK 23 took it out of the nmethod) :data:`NMETHOD_DATA` holds one recipe per shape,
the first whose fields all exist being used. The few facts the tables do not carry (where the interpreter
keeps a frame's Method* and bytecode pointer, whether a JDK's compressed streams exclude zero bytes) are in
:data:`INTERPRETER_FRAME` and :data:`UNSIGNED5_EXCLUDED`, checked where the VM exports something to check
them against. A VM that lacks any of it is refused with the missing name (counted by the caller).
"""
from __future__ import annotations

from dataclasses import dataclass

from optrace.frontend.runtimes.hotspot.vmstructs import VMStructs

# C types the tables state -> bytes (a field of another type cannot be read: refused if needed)
WIDTHS = {
    **dict.fromkeys(("u1", "bool", "CodeBlobKind", "volatile signed char", "int8_t", "uint8_t"), 1),
    **dict.fromkeys(("u2", "int16_t", "uint16_t", "unsigned short"), 2),
    **dict.fromkeys(("int", "jint", "juint", "u4", "uint32_t", "int32_t", "unsigned int", "const uint", "pid_t",
                     "OSThread::thread_id_t", "JavaThreadState"), 4),
    **dict.fromkeys(("address", "size_t", "intptr_t", "uint64_t", "int64_t", "jlong", "pthread_t"), 8),
}
# Fields only whose place is used (a structure or array held inside another): their type is not read
OFFSET_ONLY = {"heap_memory", "heap_segmap", "thread_anchor", "symbol_body", "call_wrapper_anchor"}
# field -> the names JDKs gave it, newest last (the first one the VM exports is used)
FIELDS: dict[str, tuple[str, ...]] = {
    "blob_name": ("CodeBlob::_name",),
    "blob_size": ("CodeBlob::_size",),
    "blob_frame_size": ("CodeBlob::_frame_size",),
    "blob_frame_complete": ("CodeBlob::_frame_complete_offset",),
    "blob_code_begin": ("CodeBlob::_code_begin", "CodeBlob::_code_offset"),  # a pointer (9-22), an offset (23+)
    "blob_code_end": ("CodeBlob::_code_end", "CodeBlob::_data_offset"),
    "nmethod_method": ("CompiledMethod::_method", "nmethod::_method"),
    "nmethod_compile_id": ("nmethod::_compile_id",),
    "heap_memory": ("CodeHeap::_memory",),
    "heap_segmap": ("CodeHeap::_segmap",),
    "heap_log2_segment_size": ("CodeHeap::_log2_segment_size",),
    "space_low_boundary": ("VirtualSpace::_low_boundary",),
    "space_high_boundary": ("VirtualSpace::_high_boundary",),
    "array_len": ("GenericGrowableArray::_len", "GrowableArrayBase::_len"),
    "array_data": ("GrowableArray<int>::_data",),
    "pc_desc_pc_offset": ("PcDesc::_pc_offset",),
    "pc_desc_scope_offset": ("PcDesc::_scope_decode_offset",),
    "method_const_method": ("Method::_constMethod",),
    "const_method_constants": ("ConstMethod::_constants",),
    "const_method_code_size": ("ConstMethod::_code_size",),
    "const_method_flags": ("ConstMethod::_flags", "ConstMethod::_flags._flags"),
    "const_method_name_index": ("ConstMethod::_name_index",),
    "const_method_signature_index": ("ConstMethod::_signature_index",),
    "pool_holder": ("ConstantPool::_pool_holder",),
    "pool_source_file_index": ("ConstantPool::_source_file_name_index",),
    "klass_name": ("Klass::_name",),
    "symbol_length": ("Symbol::_length",),
    "symbol_body": ("Symbol::_body",),
    # threads: their list, kernel tid, and the last Java frame a thread in the VM or native code left
    "threads_length": ("ThreadsList::_length",),
    "threads_array": ("ThreadsList::_threads",),
    "thread_osthread": ("JavaThread::_osthread", "Thread::_osthread"),
    "osthread_tid": ("OSThread::_thread_id",),
    "thread_anchor": ("JavaThread::_anchor",),
    "anchor_sp": ("JavaFrameAnchor::_last_Java_sp",),
    "anchor_pc": ("JavaFrameAnchor::_last_Java_pc",),
    "anchor_fp": ("JavaFrameAnchor::_last_Java_fp",),
    "call_wrapper_anchor": ("JavaCallWrapper::_anchor",),  # the entry frame's: the Java frames below an upcall
}
# The VM's static variables naming needs (their address in libjvm, before the load bias)
STATICS: dict[str, tuple[str, ...]] = {
    "code_heaps": ("CodeCache::_heaps",),
    "code_low_bound": ("CodeCache::_low_bound",),
    "code_high_bound": ("CodeCache::_high_bound",),
    "major_version": ("Abstract_VM_Version::_vm_major_version",),
    "call_stub_return": ("StubRoutines::_call_stub_return_address",),
    "java_threads": ("ThreadsSMRSupport::_java_thread_list",),
}
SIZES: dict[str, tuple[str, ...]] = {
    "heap_block": ("HeapBlock",),
    "code_blob": ("CodeBlob",),
    "nmethod": ("nmethod",),
    "const_method": ("ConstMethod",),
    "constant_pool": ("ConstantPool",),
    "pc_desc": ("PcDesc",),
}
INTS: dict[str, tuple[str, ...]] = {
    "has_linenumber_table": ("ConstMethod::_has_linenumber_table", "ConstMethodFlags::_misc_has_linenumber_table"),
    "entry_frame_call_wrapper": ("frame::entry_frame_call_wrapper_offset",),  # words from the entry frame's fp
}
# Where an nmethod keeps its debug information, one recipe per shape, by the fields its JDK exports: each
# part is [start, end) with each bound (base, field): the base is the nmethod itself ("blob"), its immutable
# or mutable data block (the pointer in nmethod::_immutable_data, CodeBlob::_mutable_data), or none
# ("absolute": the field holds an address). The first recipe whose fields all exist is used.
NMETHOD_DATA: tuple[tuple[str, dict[str, tuple[tuple[str, str], tuple[str, str]]]], ...] = (
    ("CompiledMethod (JDK 9-21)", {
        "metadata": (("blob", "nmethod::_metadata_offset"), ("absolute", "CompiledMethod::_scopes_data_begin")),
        "scopes_data": (("absolute", "CompiledMethod::_scopes_data_begin"), ("blob", "nmethod::_scopes_pcs_offset")),
        "scopes_pcs": (("blob", "nmethod::_scopes_pcs_offset"), ("blob", "nmethod::_dependencies_offset")),
    }),
    ("immutable and mutable data (JDK 25+)", {
        "metadata": (("mutable", "CodeBlob::_relocation_size"), ("mutable", "CodeBlob::_mutable_data_size")),
        "scopes_pcs": (("immutable", "nmethod::_scopes_pcs_offset"), ("immutable", "nmethod::_scopes_data_offset")),
        "scopes_data": (("immutable", "nmethod::_scopes_data_offset"), ("immutable", "nmethod::_immutable_data_size")),
    }),
)
BASES = {"immutable": "nmethod::_immutable_data", "mutable": "CodeBlob::_mutable_data"}
# x86_64 interpreter frames (frame_x86.hpp), in words from the frame pointer, for JDK 9+ (JDK 8 had no mirror
# slot): the exported constants are checked against the ones the table states
INTERPRETER_FRAME = {"method": -3, "bcp": -8}
INTERPRETER_CHECKS = {"frame::interpreter_frame_sender_sp_offset": -1, "frame::interpreter_frame_last_sp_offset": -2}
# CompressedReadStream's UNSIGNED5: bytes below this are excluded (JDK 20 stopped writing zero bytes)
UNSIGNED5_EXCLUDED = ((20, 1), (0, 0))  # (from major version, excluded): the first that applies
OLDEST_MAJOR = 9
MAX_STRUCT = 1 << 16  # bytes of any structure read whole, and of any field's end: real ones are below 4 KiB


@dataclass(frozen=True)
class Field:
    offset: int
    width: int  # bytes
    relative: bool = False  # an int offset from the structure's start rather than an address


@dataclass(frozen=True)
class Bound:
    base: str  # "blob", "immutable", "mutable", "absolute"
    field: Field


@dataclass(frozen=True)
class HotSpotLayout:
    fields: dict[str, Field]
    statics: dict[str, int]  # before the load bias
    sizes: dict[str, int]
    ints: dict[str, int]
    nmethod_data: dict[str, tuple[Bound, Bound]]  # "metadata", "scopes_data", "scopes_pcs"
    nmethod_bases: dict[str, Field]  # "immutable", "mutable" (the recipe's bases only)
    nmethod_shape: str
    blob_kind: Field | None  # CodeBlob::_kind (JDK 23+), else blobs are told by name
    blob_kinds: dict[int, str]  # its values (CodeBlobKind::Nmethod -> "Nmethod"...)
    interpreter_frame: dict[str, int]

    def field(self, name: str) -> Field:
        return self.fields[name]


def hotspot_layout(structs: VMStructs, major: int) -> HotSpotLayout | str:
    """The layout of a VM of JDK ``major`` whose tables are ``structs``, or the first thing missing."""
    if major < OLDEST_MAJOR:
        return f"JDK {major} not supported"
    fields = {}
    for name, candidates in FIELDS.items():
        found = _field(structs, candidates, offset_only=name in OFFSET_ONLY)
        if isinstance(found, str):
            return found
        fields[name] = found
    statics = _pick(structs.addresses, STATICS, "static")
    sizes = _pick(structs.sizes, SIZES, "type")
    ints = _pick(structs.ints, INTS, "constant")
    for found in (statics, sizes, ints):
        if isinstance(found, str):
            return found
    too_big = next((name for name, size in sizes.items() if not 0 < size <= MAX_STRUCT), None) or \
        next((name for name, f in fields.items() if not 0 <= f.offset <= MAX_STRUCT - f.width), None)
    if too_big:
        return f"implausible layout: {too_big}"
    problem = next((f"{name} is {structs.ints[name]}, not {value}" for name, value in INTERPRETER_CHECKS.items()
                    if structs.ints.get(name) != value), None)
    if problem:
        return f"unknown interpreter frame layout: {problem}"
    recipe = _nmethod_recipe(structs)
    if isinstance(recipe, str):
        return recipe
    shape, data, bases = recipe
    kind = _field(structs, ("CodeBlob::_kind",)) if "CodeBlob::_kind" in structs.offsets else None
    if isinstance(kind, str):
        return kind
    kinds = {value: name.split("::", 1)[1] for name, value in structs.ints.items() if name.startswith("CodeBlobKind::")}
    return HotSpotLayout(fields, statics, sizes, ints, data, bases, shape, kind, kinds, dict(INTERPRETER_FRAME))


def unsigned5_excluded(major: int) -> int:
    return next(excluded for first, excluded in UNSIGNED5_EXCLUDED if major >= first)


def _field(structs: VMStructs, candidates: tuple[str, ...], offset_only: bool = False) -> Field | str:
    for name in candidates:
        if name in structs.offsets:
            if offset_only:
                return Field(structs.offsets[name], 0)
            type_name = structs.types.get(name, "")
            pointer = "*" in type_name or type_name == "address"
            width = 8 if pointer else WIDTHS.get(type_name)
            if width is None:
                return f"unknown type {type_name!r} of {name}"
            return Field(structs.offsets[name], width, relative=not pointer)
    return f"unknown layout: no {candidates[-1]}"


def _pick(table: dict[str, int], wanted: dict[str, tuple[str, ...]], what: str) -> dict[str, int] | str:
    out = {}
    for name, candidates in wanted.items():
        found = next((table[c] for c in candidates if c in table), None)
        if found is None:
            return f"unknown layout: no {what} {candidates[-1]}"
        out[name] = found
    return out


def _nmethod_recipe(structs: VMStructs) -> tuple[str, dict[str, tuple[Bound, Bound]], dict[str, Field]] | str:
    for shape, parts in NMETHOD_DATA:
        names = {f for bounds in parts.values() for _, f in bounds}
        names |= {BASES[base] for bounds in parts.values() for base, _ in bounds if base in BASES}
        if not all(name in structs.offsets for name in names):
            continue
        data = {}
        for part, bounds in parts.items():
            resolved = [(base, _field(structs, (name,))) for base, name in bounds]
            bad = next((f for _, f in resolved if isinstance(f, str)), None) or \
                next((f"implausible layout: {n}" for (_, f), (_, n) in zip(resolved, bounds)
                      if not isinstance(f, str) and not 0 <= f.offset <= MAX_STRUCT - f.width), None)
            if bad:
                return bad
            data[part] = tuple(Bound(base, f) for base, f in resolved)
        bases = {}
        for base in {b.base for bounds in data.values() for b in bounds} & BASES.keys():
            found = _field(structs, (BASES[base],))
            if isinstance(found, str):
                return found
            bases[base] = found
        return shape, data, bases
    return "unknown layout: no known shape of nmethod debug information"
