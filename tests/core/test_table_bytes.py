"""bpf/table_bytes.h: BCC compiles a text reader and writer of every table's key and value, with one
argument per element of an array that is not of bytes (0.35 s of the compile for the stack store's
4,608-word chunks). Every table's key and value is a few fields for it, large values being declared as
bytes, and those keep their struct's size."""
from __future__ import annotations

import ctypes
import json

import pytest

from optrace.bpf import loader, offcpu, profiler
from optrace.bpf.stackstore import CHUNK_BYTES
from optrace.bpf.unwindmaps import MAX_MAPPINGS

# BCC's own stack-trace value (127 addresses) is the largest a table may have
MAX_FIELDS = 127


def fields(desc) -> int:
    """Scalars BCC's text engine reads and writes for a type of table_key_desc/table_leaf_desc's JSON:
    a byte array is one string."""
    if isinstance(desc, str):
        return 1
    if len(desc) == 3 and isinstance(desc[1], list) and isinstance(desc[2], str):  # [name, members, kind]
        return sum(fields(member) for member in desc[1])
    name, kind, *dims = desc  # a member: [name, type] or [name, type, [dimensions]]
    scalars = fields(kind) if isinstance(kind, list) else 1
    if dims and not (isinstance(kind, str) and "char" in kind):
        for dim in dims[0]:
            scalars *= dim
    return scalars


def descriptions(program) -> dict[str, tuple]:
    """BCC's descriptions of the program's tables (as its compile gave them, stored with the program)."""
    return {table.name.decode(): (json.loads(table.key_desc), json.loads(table.leaf_desc))
            for table in program.compiled.tables}


@pytest.fixture(scope="module")
def sampler(bpf_ready):
    """The sampler with every part: the CFI walker, Python frames, off-CPU waits."""
    sampling = profiler.Profiler(999, pids=[1], cfi_unwind=True, python=True, waits=offcpu.WaitOptions())
    program = loader.load_bcc(sampling._sources(), sampling._cflags)
    yield program
    program.cleanup()


def test_every_key_and_value_is_a_few_fields_for_bcc(sampler):
    tables = descriptions(sampler)
    assert len(tables) > 5
    large = {name: (fields(key), fields(leaf)) for name, (key, leaf) in tables.items()
             if max(fields(key), fields(leaf)) > MAX_FIELDS}
    assert not large, f"declare these values with TABLE_BYTES (bpf/table_bytes.h): {large}"


def test_the_counter_counts_array_elements():
    chunk = ["store_chunk", [["words", "unsigned long long", [4608]]], "struct_packed"]
    assert fields(chunk) == 4608
    assert fields(["store_chunk_bytes", [["bytes", "unsigned char", [36864]]], "struct_packed"]) == 1


def test_values_declared_as_bytes_keep_their_structs_size(sampler):
    assert ctypes.sizeof(sampler[b"store_arena"].Leaf) == CHUNK_BYTES
    assert ctypes.sizeof(sampler[b"unwind_procs"].Leaf) == 16 + MAX_MAPPINGS * 48  # count, pad, epoch; mappings
    assert ctypes.sizeof(sampler[b"stack_scratch"].Leaf._type_) == 512 * 8  # per CPU: Leaf is one per CPU
