"""JSON encoding of the model's dataclasses, and strict validation when decoding.

The schema is the dataclasses' own type hints, so a field added to :mod:`optrace.frontend.model` (with a
default) is written and read without touching this module. Decoding accepts only the JSON shape each hint
allows; a missing field without default, a wrong type or a dangling frame index raises :class:`SchemaError`
naming where it was found.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from optrace.frontend.model import Record


class SchemaError(ValueError):
    """The JSON does not have the shape the model expects; the message names the offending place."""


def encode(value: Any) -> Any:
    """A dataclass tree as JSON-ready values (bytes as hex, tuples as lists, dict keys as strings)."""
    if dataclasses.is_dataclass(value):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(key): encode(item) for key, item in value.items()}
    return value


def decode(data: Any, hint: Any, where: str = "record") -> Any:
    """Build a value of type `hint` from JSON data, checking every field; the result of decoding a
    :class:`Record` also has every frame index checked against the frame table."""
    value = _decode(data, hint, where)
    if hint is Record:
        _check_frame_indices(value)
    return value


def _decode(data: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(data, typing.get_args(hint), where)
    if origin in (list, tuple, dict):
        return _CONTAINERS[origin](data, typing.get_args(hint), where)
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(data, hint, where)
    return _decode_scalar(data, hint, where)


def _decode_union(data: Any, options: tuple[Any, ...], where: str) -> Any:
    if data is None and type(None) in options:
        return None
    error = SchemaError(f"{where}: unexpected {type(data).__name__}")
    for option in options:
        if option is not type(None):
            try:
                return _decode(data, option, where)
            except SchemaError as exc:
                error = exc
    raise error


def _decode_list(data: Any, args: tuple[Any, ...], where: str) -> list[Any]:
    _expect(data, list, where)
    return [_decode(item, args[0], f"{where}[{i}]") for i, item in enumerate(data)]


def _decode_tuple(data: Any, args: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    _expect(data, list, where)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(item, args[0], f"{where}[{i}]") for i, item in enumerate(data))
    if len(data) != len(args):
        raise SchemaError(f"{where}: expected {len(args)} items, got {len(data)}")
    return tuple(_decode(item, arg, f"{where}[{i}]") for i, (item, arg) in enumerate(zip(data, args)))


def _decode_dict(data: Any, args: tuple[Any, ...], where: str) -> dict[Any, Any]:
    _expect(data, dict, where)
    key_hint, value_hint = args
    result = {}
    for key, item in data.items():
        parsed_key = _decode_key(key, key_hint, where)
        result[parsed_key] = _decode(item, value_hint, f"{where}[{key!r}]")
    return result


_CONTAINERS = {list: _decode_list, tuple: _decode_tuple, dict: _decode_dict}


def _decode_key(key: str, hint: Any, where: str) -> Any:
    if hint is int:
        try:
            return int(key)
        except ValueError:
            raise SchemaError(f"{where}: key {key!r} is not an integer") from None
    return _decode_scalar(key, hint, where)


def _decode_dataclass(data: Any, cls: type, where: str) -> Any:
    _expect(data, dict, where)
    hints = _hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):
        if field.name in data:
            kwargs[field.name] = _decode(data[field.name], hints[field.name], f"{where}.{field.name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{where}: missing field {field.name!r}")
    return cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode_scalar(data: Any, hint: Any, where: str) -> Any:
    if hint is Any:
        return data
    if hint is bytes:
        _expect(data, str, where)
        try:
            return bytes.fromhex(data)
        except ValueError:
            raise SchemaError(f"{where}: not hex bytes") from None
    if hint is float and type(data) is int:
        return float(data)
    if type(data) is not hint:
        raise SchemaError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(data).__name__}")
    return data


def _expect(data: Any, kind: type, where: str) -> None:
    if type(data) is not kind:
        raise SchemaError(f"{where}: expected {kind.__name__}, got {type(data).__name__}")


def _check_frame_indices(record: Record) -> None:
    count = len(record.frames)
    for i, sample in enumerate(record.samples):
        if any(not 0 <= index < count for index in sample.frames):
            raise SchemaError(f"record.samples[{i}]: frame index out of range")
        if sample.count < 0:
            raise SchemaError(f"record.samples[{i}]: negative count")
