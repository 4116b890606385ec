"""Names from a record file made safe to print: a record may come from another user, and a symbol, a
command name or a path in it may hold terminal escapes (``\\e]0;...\\a``, ``\\e[2J``), newlines or bidi
overrides. Every text output of ``report`` (table, CSV, folded) passes its names through here; JSON
escapes them itself and keeps the original names."""
from __future__ import annotations


def escape_controls(text: str) -> str:
    """``text`` with every non-printable character (C0 and C1 controls such as ESC, BEL, CR and newline,
    format characters such as bidi overrides, lone surrogates) written as a Python-style escape:
    ``"\\x1b"`` becomes the four characters ``\\x1b``. Printable text, the common case, is returned as is."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
