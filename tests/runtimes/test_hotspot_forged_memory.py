"""The HotSpot naming and walk on memory its owner forged: the Java replay snapshots with words the honest walk
read overwritten (random values, pointers into the snapshot, small integers), many times over. Whatever the words,
the walk returns (no exception), within its frame bound and a few seconds, with printable names. (The BPF
walker and hostile JVMs of other users come with the seam, docs/runtimes.md.)"""
from __future__ import annotations

import random
import time

import pytest

from javasnapshots import load_java, process_of, replay_java
from optrace.frontend.runtimes.hotspot.methods import MAX_SYMBOL, MethodReader
from optrace.frontend.runtimes.hotspot.process import HotSpotProcess
from optrace.frontend.runtimes.hotspot.walker import MAX_FRAMES, Registers, java_stack
from snapshots import SnapshotMemory

NAMES = ["java-17", "java-25-vm", "java-17-upcall"]
ROUNDS = 300
WORDS = 8  # overwritten per round, among those the walk read


class ReadWords(SnapshotMemory):
    """A snapshot's memory that keeps the 8-byte words read."""

    def __init__(self, pages) -> None:
        super().__init__(pages)
        self.words: set[int] = set()

    def read(self, address: int, size: int) -> bytes:
        if size <= 256:
            self.words.update(range(address & ~7, address + size, 8))
        return super().read(address, size)


def walk_words(snapshot) -> list[int]:
    """The words the walk reads once the VM's tables are known."""
    honest = process_of(snapshot)
    memory = ReadWords(snapshot.pages)
    process = HotSpotProcess(0, memory, snapshot.bias, honest.structs, honest.layout, honest.major, honest.release)
    regs = snapshot.registers
    java_stack(process, Registers(regs["ip"], regs["sp"], regs["bp"], regs["r13"]), snapshot.tid)
    return sorted(word for word in memory.words if word & ~4095 in snapshot.pages and word % 4096 <= 4088)


def forged(snapshot, rng: random.Random, targets: list[int]):
    pages = dict(snapshot.pages)
    addresses = sorted(pages)
    for _ in range(WORDS):
        target = rng.choice(targets)
        page, at = target & ~4095, target % 4096
        choice = rng.random()
        if choice < 0.4:
            word = rng.choice(addresses) + rng.randrange(0, 4096)  # a pointer into what the snapshot holds
        elif choice < 0.7:
            word = rng.randrange(0, 1 << 16)
        else:
            word = rng.getrandbits(64)
        data = bytearray(pages[page])
        data[at:at + 8] = word.to_bytes(8, "little")
        pages[page] = bytes(data)
    return snapshot.__class__(**{**snapshot.__dict__, "pages": pages, "name": f"{snapshot.name}-forged"})


@pytest.mark.parametrize("name", NAMES)
def test_forged_memory_never_breaks_the_walk(name):
    snapshot = load_java(name)
    targets = walk_words(snapshot)
    rng = random.Random(name)
    changed = 0
    for _ in range(ROUNDS):
        started = time.monotonic()
        try:
            stack = replay_java(forged(snapshot, rng, targets))
        except AssertionError as refused:  # the forged tables were refused at attach: a counted refusal
            assert "unknown" in str(refused) or "implausible" in str(refused) or "bad" in str(refused) \
                or "unreadable" in str(refused), refused
            continue
        assert time.monotonic() - started < 5
        assert len(stack.frames) <= MAX_FRAMES + 64
        assert all(frame.name.isprintable() and frame.file.isprintable() for frame in stack.frames)
        changed += stack.frames != snapshot.expected
    assert changed, "no forgery changed the walk: the test proves nothing"


def test_a_forged_method_name_is_cut_and_printable():
    """A Method whose class name holds a terminal escape and whose name is 60,000 bytes: the class reads with
    the escape replaced, the name is cut at MAX_SYMBOL bytes and marked."""
    process = process_of(load_java("java-17"))
    layout, structs = process.layout, process.structs
    base = 0x7F0000000000
    memory = bytearray(20 * 4096)
    method, const_method, pool, klass = base, base + 0x100, base + 0x200, base + 0x400
    class_symbol, signature_symbol, name_symbol = base + 0x600, base + 0x700, base + 0x800

    def put(address: int, offset: int, value: int, width: int = 8) -> None:
        memory[address - base + offset:address - base + offset + width] = value.to_bytes(width, "little")

    def symbol(address: int, text: bytes) -> None:
        put(address, layout.field("symbol_length").offset, len(text), 2)
        at = address - base + layout.field("symbol_body").offset
        memory[at:at + len(text)] = text

    put(method, layout.field("method_const_method").offset, const_method)
    put(const_method, layout.field("const_method_constants").offset, pool)
    put(const_method, layout.field("const_method_name_index").offset, 1, 2)
    put(const_method, layout.field("const_method_signature_index").offset, 2, 2)
    put(pool, layout.field("pool_holder").offset, klass)
    put(pool, structs.offsets["ConstantPool::_length"], 3, 4)
    put(pool, layout.sizes["constant_pool"] + 8, name_symbol)
    put(pool, layout.sizes["constant_pool"] + 16, signature_symbol)
    put(klass, layout.field("klass_name").offset, class_symbol)
    symbol(class_symbol, b"Evil\x1b[31mClass")
    symbol(signature_symbol, b"()V")
    symbol(name_symbol, b"m" * 60000)
    pages = {base + i: bytes(memory[i:i + 4096]) for i in range(0, len(memory), 4096)}
    found = MethodReader(SnapshotMemory(pages), layout, 0, structs.offsets["ConstantPool::_length"]).method(method)
    assert found.klass == "Evil?[31mClass"
    assert found.name == "m" * MAX_SYMBOL + "…" and found.signature == "()V"
