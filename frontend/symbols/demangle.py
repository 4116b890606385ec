"""Readable names: C++ through libstdc++'s demangler (cxxfilt), Rust legacy and v0 mangling here.

:func:`demangle` never raises: a name it cannot decode comes back unchanged.
"""
from __future__ import annotations

import functools
import re

RUST_HASH = re.compile(r"h[0-9a-f]{16}")
MAX_V0_BACKREFS = 64  # real symbols use a handful
MAX_CACHED_NAME = 512
MAX_DEMANGLED = 4096  # characters of a readable name (longer ones are cut, ending in "...")
RUST_ESCAPES = {"SP": "@", "BP": "*", "RF": "&", "LT": "<", "GT": ">", "LP": "(", "RP": ")", "C": ","}
RUST_BASIC_TYPES = {
    "a": "i8", "b": "bool", "c": "char", "d": "f64", "e": "str", "f": "f32", "h": "u8", "i": "isize",
    "j": "usize", "l": "i32", "m": "u32", "n": "i128", "o": "u128", "s": "i16", "t": "u16", "u": "()",
    "v": "...", "x": "i64", "y": "u64", "z": "!", "p": "_",
}


def demangle(name: str) -> str:
    """The readable form of ``name``, at most MAX_DEMANGLED characters. Names come from files any user
    writes: only short ones are cached (16k entries of up to MAX_CACHED_NAME characters), so long
    unique names cannot fill the heap of a daemon that runs for months."""
    if len(name) > MAX_CACHED_NAME:
        return _demangle(name)
    return _cached_demangle(name)


def _demangle(name: str) -> str:
    try:
        if name.startswith("_R"):
            readable = demangle_rust_v0(name) or name
        elif name.startswith("_ZN") and (rust := demangle_rust_legacy(name)):
            readable = rust
        elif name.startswith("_Z"):
            import cxxfilt  # here: its import (4-10 ms) is not on the way to a recording's first sample

            readable = cxxfilt.demangle(name, external_only=False)
        else:
            readable = name
    except Exception:  # a demangler bug must never lose a frame
        readable = name
    return readable if len(readable) <= MAX_DEMANGLED else readable[:MAX_DEMANGLED - 3] + "..."


_cached_demangle = functools.lru_cache(maxsize=1 << 14)(_demangle)


def demangle_rust_legacy(name: str) -> str | None:
    """``_ZN3std2rt10lang_start17h0123456789abcdefE`` -> ``std::rt::lang_start`` (hash dropped), or
    None when ``name`` is not a legacy Rust symbol (then it is C++)."""
    parts = []
    pos = 3
    while pos < len(name) and name[pos].isdigit():
        digits = re.match(r"\d+", name[pos:]).group()
        pos += len(digits)
        parts.append(name[pos:pos + int(digits)])
        pos += int(digits)
    if pos >= len(name) or name[pos] != "E" or len(parts) < 2 or not RUST_HASH.fullmatch(parts[-1]):
        return None
    return "::".join(_rust_unescape(part) for part in parts[:-1])


def _rust_unescape(part: str) -> str:
    if part.startswith("_$"):
        part = part[1:]

    def escape(match: re.Match) -> str:
        code = match.group(1)
        if code.startswith("u"):
            return chr(int(code[1:], 16))
        return RUST_ESCAPES[code]

    return re.sub(r"\$(SP|BP|RF|LT|GT|LP|RP|C|u[0-9a-f]+)\$", escape, part).replace("..", "::")


def demangle_rust_v0(name: str) -> str | None:
    """Rust v0 mangling (RFC 2603) for paths, generic arguments and common types; None for the
    constructs it does not handle (fn pointers, dyn types, punycode identifiers)."""
    try:
        return _V0Parser(name[2:]).symbol()
    except (_Unsupported, IndexError, ValueError, RecursionError):
        return None


class _Unsupported(Exception):
    pass


class _V0Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.backrefs = 0

    def symbol(self) -> str:
        if self.peek().isdigit():
            self.decimal()
        return self.path(value=True)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        char = self.text[self.pos]
        self.pos += 1
        return char

    def decimal(self) -> int:
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        return int(self.text[start:self.pos])

    def base62(self) -> int:
        if self.peek() == "_":
            self.pos += 1
            return 0
        value = 0
        while (char := self.take()) != "_":
            value = value * 62 + "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".index(char)
        return value + 1

    def disambiguator(self) -> int:
        if self.peek() == "s":
            self.pos += 1
            return self.base62()
        return 0

    def identifier(self) -> tuple[str, int]:
        index = self.disambiguator()
        if self.peek() == "u":
            raise _Unsupported("punycode")
        length = self.decimal()
        if self.peek() == "_":
            self.pos += 1
        ident = self.text[self.pos:self.pos + length]
        self.pos += length
        return ident, index

    def backref(self, parse) -> str:
        """Backrefs may nest into exponentially long output (a 188-character name took 15 s): at most
        MAX_V0_BACKREFS are expanded per name, else the name is shown as it is."""
        self.backrefs += 1
        if self.backrefs > MAX_V0_BACKREFS:
            raise _Unsupported("too many backrefs")
        target = self.base62()
        saved, self.pos = self.pos, target
        try:
            return parse()
        finally:
            self.pos = saved

    def path(self, value: bool = False) -> str:
        tag = self.take()
        if tag == "C":
            return self.identifier()[0]
        if tag == "N":
            namespace = self.take()
            prefix = self.path(value)
            ident, index = self.identifier()
            if namespace.isupper():
                kind = {"C": "closure", "S": "shim"}.get(namespace, namespace)
                return f"{prefix}::{{{kind}{':' + ident if ident else ''}#{index}}}"
            return f"{prefix}::{ident}"
        if tag == "M":
            self.disambiguator()
            self.path()
            return f"<{self.type()}>"
        if tag == "X":
            self.disambiguator()
            self.path()
            return f"<{self.type()} as {self.path()}>"
        if tag == "Y":
            return f"<{self.type()} as {self.path()}>"
        if tag == "I":
            prefix = self.path(value)
            args = []
            while self.peek() != "E":
                args.append(self.generic_arg())
            self.pos += 1
            return f"{prefix}{'::' if value else ''}<{', '.join(a for a in args if a)}>"
        if tag == "B":
            return self.backref(lambda: self.path(value))
        raise _Unsupported(tag)

    def generic_arg(self) -> str:
        if self.peek() == "L":
            self.pos += 1
            self.base62()
            return ""
        if self.peek() == "K":
            self.pos += 1
            return self.const()
        return self.type()

    def const(self) -> str:
        if self.peek() == "p":
            self.pos += 1
            return "_"
        if self.peek() == "B":
            self.pos += 1
            return self.backref(self.const)
        kind = self.take()
        negative = self.peek() == "n"
        if negative:
            self.pos += 1
        start = self.pos
        while self.take() != "_":
            pass
        digits = self.text[start:self.pos - 1]
        number = int(digits, 16) if digits else 0
        if kind == "b":
            return "true" if number else "false"
        if kind == "c":
            return repr(chr(number))
        return f"{'-' if negative else ''}{number}"

    def type(self) -> str:
        tag = self.peek()
        if tag in RUST_BASIC_TYPES:
            self.pos += 1
            return RUST_BASIC_TYPES[tag]
        if tag in "CNMXYI":
            return self.path()
        self.pos += 1
        if tag == "B":
            return self.backref(self.type)
        if tag in "RQ":
            if self.peek() == "L":
                self.pos += 1
                self.base62()
            return ("&" if tag == "R" else "&mut ") + self.type()
        if tag in "PO":
            return ("*const " if tag == "P" else "*mut ") + self.type()
        if tag == "S":
            return f"[{self.type()}]"
        if tag == "A":
            inner = self.type()
            return f"[{inner}; {self.const()}]"
        if tag == "T":
            items = []
            while self.peek() != "E":
                items.append(self.type())
            self.pos += 1
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        raise _Unsupported(tag)
