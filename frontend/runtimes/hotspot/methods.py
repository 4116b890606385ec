"""A Java method named from its ``Method*``: the class (the constant pool's holder, its ``Symbol`` name), the
method's name and signature (constant pool entries the ConstMethod indexes), the source file (the pool's
source file entry) and the line number table (compressed after the bytecodes), as Java people read them:
``java.util.TimSort.binarySort``, ``Phases.lambda$sortPhase$0``, a hidden class without its address suffix
(``Phases$$Lambda/0x0000000801000a00``, JDK 17's ``Phases$$Lambda$1+0x00007fb620000a08``, read
``Phases$$Lambda`` and ``Phases$$Lambda$1``).

Everything is the process's memory: a symbol is at most MAX_SYMBOL bytes (longer ones are cut, marked),
shown with control characters replaced (no terminal escapes get through), a pool index must be inside the
pool, a table at most MAX_LINE_TABLE bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from optrace.frontend.runtimes.hotspot.layout import HotSpotLayout
from optrace.frontend.runtimes.hotspot.unsigned5 import line_of, line_table
from optrace.frontend.runtimes.hotspot.values import value
from optrace.frontend.runtimes.hotspot.vmstructs import Memory

MAX_SYMBOL = 1024
MAX_LINE_TABLE = 8192
MAX_CODE_SIZE = 0xFFFF  # the JVM's limit on a method's bytecodes
POOL_LENGTH_AT = "ConstantPool::_length"
TRUNCATED = "…"
HIDDEN_SUFFIX = re.compile(r"[/+]0x[0-9a-fA-F]+$")  # a hidden class's name ends with its address


@dataclass(frozen=True)
class JavaMethod:
    klass: str  # "java.util.Arrays"
    name: str  # "sort"
    signature: str  # "([Ljava/lang/Object;Ljava/util/Comparator;)V"
    source: str  # "Arrays.java", "" when the class has none
    lines: tuple[tuple[int, int], ...]  # (bci, line)
    code_size: int

    @property
    def qualified(self) -> str:
        return f"{self.klass}.{self.name}"

    def line(self, bci: int) -> int:
        return line_of(self.lines, bci) if 0 <= bci < max(self.code_size, 1) else 0


def java_class_name(internal: str) -> str:
    """"java/util/Arrays" -> "java.util.Arrays"; a hidden class's address suffix dropped."""
    return HIDDEN_SUFFIX.sub("", internal).replace("/", ".")


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


class MethodReader:
    """Names methods of one VM (``excluded``: its UNSIGNED5 form, layout.unsigned5_excluded)."""

    def __init__(self, memory: Memory, layout: HotSpotLayout, excluded: int, pool_length: int | None) -> None:
        self._memory = memory
        self._layout = layout
        self._excluded = excluded
        self._pool_length = pool_length  # offset of ConstantPool::_length (int), None when not exported

    def method(self, address: int) -> JavaMethod | str:
        """The method at ``address`` (a Method*), or why it cannot be named."""
        layout, memory = self._layout, self._memory
        const_method = memory.pointer(address + layout.field("method_const_method").offset)
        if not const_method:
            return "Method unreadable"
        header = memory.read_exact(const_method, layout.sizes["const_method"])
        pool = value(header, layout.field("const_method_constants"))
        code_size = value(header, layout.field("const_method_code_size"))
        if header is None or not pool or code_size is None or code_size > MAX_CODE_SIZE:
            return "ConstMethod unreadable"
        pool_header = memory.read_exact(pool, layout.sizes["constant_pool"])
        holder = value(pool_header, layout.field("pool_holder"))
        if pool_header is None or not holder:
            return "ConstantPool unreadable"
        klass = self._symbol(memory.pointer(holder + layout.field("klass_name").offset))
        name = self._pool_symbol(pool, pool_header, value(header, layout.field("const_method_name_index")))
        signature = self._pool_symbol(pool, pool_header, value(header, layout.field("const_method_signature_index")))
        source = self._pool_symbol(pool, pool_header, value(pool_header, layout.field("pool_source_file_index")))
        if klass is None or name is None:
            return "method name unreadable"
        return JavaMethod(java_class_name(klass), name, signature or "", source or "",
                          self._lines(const_method, header, code_size), code_size)

    def _lines(self, const_method: int, header: bytes, code_size: int) -> tuple[tuple[int, int], ...]:
        flags = value(header, self._layout.field("const_method_flags")) or 0
        if not flags & self._layout.ints["has_linenumber_table"]:
            return ()
        data = self._memory.read(const_method + self._layout.sizes["const_method"] + code_size, MAX_LINE_TABLE)
        return line_table(data, self._excluded)

    def _pool_symbol(self, pool: int, pool_header: bytes, index: int | None) -> str | None:
        """The Symbol of constant pool entry ``index`` (0: none)."""
        if not index:
            return None
        if self._pool_length is not None:
            length = int.from_bytes(pool_header[self._pool_length:self._pool_length + 4], "little")
            if index >= length:
                return None
        entry = self._memory.pointer(pool + self._layout.sizes["constant_pool"] + 8 * index)
        return self._symbol(entry & ~1 if entry else None)

    def _symbol(self, address: int | None) -> str | None:
        """A Symbol's text (modified UTF-8, shown printable; cut at MAX_SYMBOL bytes, marked)."""
        if not address:
            return None
        layout = self._layout
        length_at, body_at = layout.field("symbol_length").offset, layout.field("symbol_body").offset
        head = self._memory.read_exact(address, body_at)
        if head is None:
            return None
        length = int.from_bytes(head[length_at:length_at + 2], "little")
        body = self._memory.read_exact(address + body_at, min(length, MAX_SYMBOL)) if length else b""
        if body is None:
            return None
        text = printable(body.decode("utf-8", "replace"))
        return text + TRUNCATED if length > MAX_SYMBOL else text
