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
from typing import Any, Callable

from optrace.frontend.model import Record


class SchemaError(ValueError):
    """The JSON does not have the shape the model expects; the message names the offending place."""

    def __init__(self, problem: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path = path

    def at(self, part: str) -> "SchemaError":
        """The same error, one level further out (the location is built only when an error happens)."""
        return SchemaError(self.problem, (part, *self.path))

    def __str__(self) -> str:
        return f"record{''.join(self.path)}: {self.problem}"


Decoder = Callable[[Any], Any]


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


def decode(data: Any, hint: Any) -> Any:
    """Build a value of type `hint` from JSON data, checking every field; the result of decoding a
    :class:`Record` also has every frame index checked against the frame table."""
    value = _decoder(hint)(data)
    if hint is Record:
        _check_frame_indices(value)
    return value


@functools.cache
def _decoder(hint: Any) -> Decoder:
    """A decoder for one type hint, built once: records hold tens of thousands of frames and samples."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _union_decoder(typing.get_args(hint))
    if origin in _CONTAINERS:
        return _CONTAINERS[origin](typing.get_args(hint))
    if dataclasses.is_dataclass(hint):
        return _dataclass_decoder(hint)
    return functools.partial(_decode_scalar, hint=hint)


def _union_decoder(options: tuple[Any, ...]) -> Decoder:
    nullable = type(None) in options
    decoders = [_decoder(option) for option in options if option is not type(None)]

    def decode_union(data: Any) -> Any:
        if data is None and nullable:
            return None
        error = SchemaError(f"unexpected {type(data).__name__}")
        for decoder in decoders:
            try:
                return decoder(data)
            except SchemaError as exc:
                error = exc
        raise error

    return decode_union


def _items(data: Any, decoder: Decoder) -> list[Any]:
    _expect(data, list)
    out = []
    for i, item in enumerate(data):
        try:
            out.append(decoder(item))
        except SchemaError as exc:
            raise exc.at(f"[{i}]") from None
    return out


def _list_decoder(args: tuple[Any, ...]) -> Decoder:
    item = _decoder(args[0])
    return lambda data: _items(data, item)


def _tuple_decoder(args: tuple[Any, ...]) -> Decoder:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])
        return lambda data: tuple(_items(data, item))
    decoders = [_decoder(arg) for arg in args]

    def decode_fixed(data: Any) -> tuple[Any, ...]:
        _expect(data, list)
        if len(data) != len(decoders):
            raise SchemaError(f"expected {len(decoders)} items, got {len(data)}")
        out = []
        for i, (decoder, item) in enumerate(zip(decoders, data)):
            try:
                out.append(decoder(item))
            except SchemaError as exc:
                raise exc.at(f"[{i}]") from None
        return tuple(out)

    return decode_fixed


def _dict_decoder(args: tuple[Any, ...]) -> Decoder:
    key_hint, value_hint = args
    value_decoder = _decoder(value_hint)

    def decode_dict(data: Any) -> dict[Any, Any]:
        _expect(data, dict)
        result = {}
        for key, item in data.items():
            try:
                result[_decode_key(key, key_hint)] = value_decoder(item)
            except SchemaError as exc:
                raise exc.at(f"[{key!r}]") from None
        return result

    return decode_dict


_CONTAINERS = {list: _list_decoder, tuple: _tuple_decoder, dict: _dict_decoder}


def _decode_key(key: str, hint: Any) -> Any:
    if hint is int:
        try:
            return int(key)
        except ValueError:
            raise SchemaError(f"key {key!r} is not an integer") from None
    return _decode_scalar(key, hint)


def _dataclass_decoder(cls: type) -> Decoder:
    hints = typing.get_type_hints(cls)
    fields = [(f.name, _decoder(hints[f.name]),
               f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
              for f in dataclasses.fields(cls)]

    def decode_dataclass(data: Any) -> Any:
        _expect(data, dict)
        kwargs = {}
        for name, decoder, required in fields:
            if name in data:
                try:
                    kwargs[name] = decoder(data[name])
                except SchemaError as exc:
                    raise exc.at(f".{name}") from None
            elif required:
                raise SchemaError(f"missing field {name!r}")
        return cls(**kwargs)

    return decode_dataclass


def _decode_scalar(data: Any, hint: Any) -> Any:
    if hint is Any:
        return data
    if hint is bytes:
        _expect(data, str)
        try:
            return bytes.fromhex(data)
        except ValueError:
            raise SchemaError("not hex bytes") from None
    if hint is float and type(data) is int:
        return float(data)
    if type(data) is not hint:
        raise SchemaError(f"expected {getattr(hint, '__name__', hint)}, got {type(data).__name__}")
    return data


def _expect(data: Any, kind: type) -> None:
    if type(data) is not kind:
        raise SchemaError(f"expected {kind.__name__}, got {type(data).__name__}")


def _check_frame_indices(record: Record) -> None:
    count = len(record.frames)
    for i, sample in enumerate(record.samples):
        if any(not 0 <= index < count for index in sample.frames):
            raise SchemaError("frame index out of range", (".samples", f"[{i}]"))
        if sample.count < 0:
            raise SchemaError("negative count", (".samples", f"[{i}]"))
