"""ctypes types from the descriptions BCC's compiler gives of a program's types: a table's key and value
(JSON: a scalar's C name, or [name, [members], "struct" | "struct_packed" | "union"], a member being
[name, type], [name, type, [length]] or [name, type, bits]) and a perf output's event ("name#type" per
field). The same rules as BCC 0.26's Python (BPF._decode_table_type, table._get_event_class), so a stored
program's tables have the very ctypes types a compiled one had.

A description comes from a stored entry (its checksum only says it is the one written): anything not of
these shapes is a :class:`TypeDescError`, never another exception, and nesting is bounded.
"""
from __future__ import annotations

import ctypes as ct
import re
from typing import Any

from optrace.errors import MalformedInput

MAX_DEPTH = 32
SCALARS: dict[str, Any] = {
    "_Bool": ct.c_bool,
    "char": ct.c_char,
    "wchar_t": ct.c_wchar,
    "unsigned char": ct.c_ubyte,
    "short": ct.c_short,
    "unsigned short": ct.c_ushort,
    "int": ct.c_int,
    "unsigned int": ct.c_uint,
    "long": ct.c_long,
    "unsigned long": ct.c_ulong,
    "long long": ct.c_longlong,
    "unsigned long long": ct.c_ulonglong,
    "float": ct.c_float,
    "double": ct.c_double,
    "long double": ct.c_longdouble,
    "__int128": ct.c_int64 * 2,
    "unsigned __int128": ct.c_uint64 * 2,
}
KINDS = {"struct": (ct.Structure, False), "struct_packed": (ct.Structure, True), "union": (ct.Union, False)}
EVENT_FIELDS: dict[str, Any] = {
    "char": ct.c_char, "s8": ct.c_char, "unsigned char": ct.c_ubyte, "u8": ct.c_ubyte, "u8 *": ct.c_char_p,
    "char *": ct.c_char_p, "short": ct.c_short, "s16": ct.c_short, "unsigned short": ct.c_ushort,
    "u16": ct.c_ushort, "int": ct.c_int, "s32": ct.c_int, "enum": ct.c_int, "unsigned int": ct.c_uint,
    "u32": ct.c_uint, "long": ct.c_long, "unsigned long": ct.c_ulong, "long long": ct.c_longlong,
    "s64": ct.c_longlong, "unsigned long long": ct.c_ulonglong, "u64": ct.c_ulonglong,
    "__int128": ct.c_longlong * 2, "unsigned __int128": ct.c_ulonglong * 2, "void *": ct.c_void_p,
}
_ARRAY_FIELD = re.compile(r"([^ ]+) ?\[([0-9]+)\]$")
MAX_ARRAY = 1 << 24


class TypeDescError(MalformedInput):
    pass


def decode_type(desc: Any, depth: int = 0) -> Any:
    """The ctypes type of a table key or value description."""
    if isinstance(desc, str):
        try:
            return SCALARS[desc]
        except KeyError:
            raise TypeDescError(f"unknown scalar type {desc!r}") from None
    if depth > MAX_DEPTH or not isinstance(desc, list) or len(desc) not in (2, 3) or not isinstance(desc[1], list):
        raise TypeDescError("not a type description")
    base, packed = KINDS.get(desc[2] if len(desc) == 3 else "struct", (None, False))
    if base is None:
        raise TypeDescError(f"unknown kind {desc[2]!r}")
    anonymous: list[str] = []
    fields = [_member(member, anonymous, depth) for member in desc[1]]
    namespace: dict[str, Any] = {"_anonymous_": anonymous, "_fields_": fields}
    if packed:
        namespace["_pack_"] = 1
    try:
        return type(str(desc[0]), (base,), namespace)
    except (TypeError, ValueError, AttributeError) as exc:  # ctypes' refusals (a bit field of a struct...)
        raise TypeDescError(str(exc)) from None


def _member(member: Any, anonymous: list[str], depth: int) -> tuple:
    if not isinstance(member, list) or len(member) not in (2, 3) or not isinstance(member[0], str):
        raise TypeDescError("not a member description")
    if len(member) == 2:
        return member[0], decode_type(member[1], depth + 1)
    name, kind, extra = member
    if isinstance(extra, list) and extra and _count(extra[0]):  # BCC's Python reads the first dimension only
        return name, decode_type(kind, depth + 1) * extra[0]
    if isinstance(extra, int) and not isinstance(extra, bool) and 0 < extra <= 64:
        return name, decode_type(kind, depth + 1), extra
    if isinstance(extra, str) and extra in KINDS:  # a nested struct or union; an unnamed one's members read as the outer's
        if name == "":
            name = f"__anon{len(anonymous)}"
            anonymous.append(name)
        return name, decode_type(member, depth + 1)
    raise TypeDescError(f"cannot decode member {name!r}")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ARRAY


def event_type(fields: list[str]) -> type:
    """A perf or ring buffer output's event struct from BCC's "name#type" field list."""
    members = []
    for field in fields:
        name, sep, kind = field.rpartition("#") if isinstance(field, str) else ("", "", "")
        if not sep:
            raise TypeDescError(f"not an event field: {field!r}")
        kind = "enum" if kind.startswith("enum ") else kind
        array = _ARRAY_FIELD.match(kind)
        base = EVENT_FIELDS.get(array.group(1) if array else kind)
        if base is None or (array and int(array.group(2)) > MAX_ARRAY):
            raise TypeDescError(f"event field {name!r} has a type BCC's Python does not read: {kind!r}")
        members.append((name, base * int(array.group(2)) if array else base))
    return type("", (ct.Structure,), {"_fields_": members})
