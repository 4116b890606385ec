"""JSON encoding of the model's dataclasses, and strict validation when decoding.

The schema is the dataclasses' own type hints, so a field added to :mod:`optrace.model` (with a
default) is written and read without touching this module. Decoding accepts only the JSON shape each hint
allows; a missing field without default, a wrong type, a number outside its range or a dangling frame index
raises :class:`SchemaError` naming where it was found. Numbers are in ``0 .. 2**64-1`` unless the hint is
``Annotated`` with other :class:`~optrace.model.Bounds`, and floats are finite: a record file is
someone else's input, and ``10**400`` or ``Infinity`` must not reach the report's arithmetic.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
import re
import types
import typing
from typing import Any, Callable

from optrace.errors import MalformedInput
from optrace.model import Bounds, Record

DEFAULT_BOUNDS = Bounds(0, (1 << 64) - 1)
INT_KEY = re.compile(r"-?[0-9]{1,20}")  # what json.dumps makes of an int dict key, nothing int() also takes


class SchemaError(MalformedInput):
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
    """A dataclass tree as JSON-ready values (bytes as hex, tuples as lists, dict keys as strings). A flat
    dataclass (a record's frames and samples: 100k of them at 10k samples a second) is its own ``__dict__``,
    copied, its tuples as lists."""
    tuples = _flat_tuple_fields(type(value))
    if tuples is not None:
        document = dict(value.__dict__)
        for name in tuples:
            document[name] = list(document[name])
        return document
    if dataclasses.is_dataclass(value):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(key): encode(item) for key, item in value.items()}
    return value


_FLAT_SCALARS = (int, str, bool, float, type(None))


@functools.cache
def _flat_tuple_fields(cls: type) -> tuple[str, ...] | None:
    """For a dataclass with a ``__dict__`` whose fields hold only numbers, strings, booleans, None and
    tuples of those, its tuple fields; else None."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__slots__"):
        return None
    hints = typing.get_type_hints(cls)
    if not all(_flat_hint(hint) for hint in hints.values()):
        return None
    return tuple(name for name, hint in hints.items() if typing.get_origin(hint) is tuple)


def _flat_hint(hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _flat_hint(args[0])
    if origin in (typing.Union, types.UnionType):
        return all(_flat_hint(arg) for arg in args)
    if origin is tuple:
        return all(arg is Ellipsis or arg in _FLAT_SCALARS for arg in args)
    return hint in _FLAT_SCALARS


def decode(data: Any, hint: Any) -> Any:
    """Build a value of type `hint` from JSON data, checking every field; the result of decoding a
    :class:`Record` also has every frame index checked against the frame table.

    Consumes `data`: each list item is dropped once decoded, so a large record is never held whole
    twice, as JSON and as dataclasses."""
    value = _decoder(hint)(data)
    if hint is Record:
        _check_frame_indices(value)
    return value


@functools.cache
def _decoder(hint: Any) -> Decoder:
    """A decoder for one type hint, built once: records hold tens of thousands of frames and samples."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _annotated_decoder(hint)
    if origin in (typing.Union, types.UnionType):
        return _optional_decoder(typing.get_args(hint))
    if origin in _CONTAINERS:
        return _CONTAINERS[origin](typing.get_args(hint))
    if dataclasses.is_dataclass(hint):
        return _dataclass_decoder(hint)
    return _scalar_decoder(hint)


def _annotated_decoder(hint: Any) -> Decoder:
    base, *extras = typing.get_args(hint)
    return _scalar_decoder(base, next((extra for extra in extras if isinstance(extra, Bounds)), DEFAULT_BOUNDS))


def _scalar_decoder(hint: Any, bounds: Bounds = DEFAULT_BOUNDS) -> Decoder:
    """A value that is already right (what every real record holds) passes one type check; anything else
    goes to :func:`_decode_scalar`, which converts it or names the problem."""
    slow = functools.partial(_decode_scalar, hint=hint, bounds=bounds)
    if hint is int:
        low, high = bounds.low, bounds.high
        return lambda data: data if type(data) is int and low <= data <= high else slow(data)
    if hint in (str, bool):
        return lambda data: data if type(data) is hint else slow(data)
    return slow


def _optional_decoder(options: tuple[Any, ...]) -> Decoder:
    """``X | None``, the only union a record holds (trying several decoders on data they consume
    would not work)."""
    others = [option for option in options if option is not type(None)]
    if len(others) != 1 or len(options) != 2:
        raise TypeError(f"record files hold unions of one type and None only, not {options}")
    decoder = _decoder(others[0])
    return lambda data: None if data is None else decoder(data)


def _items(data: Any, decoder: Decoder, start: int = 0, end: int | None = None) -> list[Any]:
    """``data[start:end]`` decoded item by item; each JSON item is dropped once decoded (see decode())."""
    _expect(data, list)
    out = []
    for i in range(start, len(data) if end is None else end):
        try:
            out.append(decoder(data[i]))
        except SchemaError as exc:
            raise exc.at(f"[{i}]") from None
        data[i] = None
    return out


def _list_decoder(args: tuple[Any, ...]) -> Decoder:
    item = _decoder(args[0])
    ints = _int_bounds(args[0])
    if ints is not None:
        return lambda data: list(data) if _all_ints_in(data, ints) else _items(data, item)
    columns = _columns_decoder(args[0]) if dataclasses.is_dataclass(args[0]) else None
    if columns is None:
        return lambda data: _items(data, item)
    table = _table_decoder(args[0], item)
    return lambda data: table(data) if type(data) is dict else _table_items(data, item, columns)


Columns = Callable[[list[Any]], "list[Any] | None"]
TABLE_CHUNK = 8192  # objects checked and built at a time: the JSON of a chunk is dropped once it is built


def _table_items(data: Any, decoder: Decoder, columns: Columns) -> list[Any]:
    """A list of flat dataclasses (a record's frames and samples) checked a field at a time over a chunk
    of items, in C (``map``, ``set``, ``min``/``max``), instead of one decoder call per value. A chunk that
    is not exactly what :func:`encode` writes (a missing field, a wrong type, a number out of range) is
    decoded again item by item, which gives it its defaults or names the problem."""
    _expect(data, list)
    out: list[Any] = []
    for start in range(0, len(data), TABLE_CHUNK):
        end = min(start + TABLE_CHUNK, len(data))
        built = columns(data[start:end])
        out += _items(data, decoder, start, end) if built is None else built
        data[start:end] = [None] * (end - start)
    return out


def _columns_decoder(cls: type) -> Columns | None:
    """A :data:`Columns` decoder for a dataclass whose fields all have a column check, else None."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = dataclasses.fields(cls)
    # A left-out field takes its default; a required field's "default" is MISSING, which no check passes.
    checks = [(f.name, f.default, _column_check(hints[f.name])) for f in fields]
    if not all(f.init for f in fields) or any(check is None for *_, check in checks):
        return None

    adoptable = not hasattr(cls, "__slots__") and not hasattr(cls, "__post_init__")

    def decode_columns(items: list[Any]) -> list[Any] | None:
        if set(map(type, items)) != {dict}:
            return None
        values = []
        complete = set(map(len, items)) == {len(checks)}  # and no field left out: each holds every field
        for name, default, check in checks:
            raw = list(map(dict.get, items, itertools.repeat(name), itertools.repeat(_ABSENT)))
            if _ABSENT in raw:
                complete = False
                raw = [default if value is _ABSENT else value for value in raw]
            column = check(raw)
            if column is None:
                return None
            complete = complete and column is raw
            values.append(column)
        if complete and adoptable:  # the JSON objects are already what the instances' __dict__ would be
            return list(map(_adopt, itertools.repeat(cls), items))
        return list(map(cls, *values))

    return decode_columns


_ABSENT = object()


def _adopt(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of `cls` whose attributes are `fields` (every field of it, checked), made as pickle
    restores one: without ``__init__``, which for a frozen dataclass sets each field through
    ``object.__setattr__`` (80 % of the time of decoding a record's frames)."""
    instance = object.__new__(cls)
    object.__setattr__(instance, "__dict__", fields)
    return instance


# A record file (format 2) holds a list of flat dataclasses (its frames and samples) as a table: one JSON list
# per field, in row order, and for a tuple field the rows' lengths and all their items in one list:
#     {"pid": [7, 7], "comm": ["a", "a"], "frames": {"lengths": [2, 1], "values": [4, 0, 4]}, ...}
# 91k samples of 83k distinct stacks: 9.0 MB of JSON as objects (json.loads 0.07 s, their checks 0.09 s), 5.6 MB
# as a table (0.04 s, 0.05 s with the objects built). A list of objects (format 1) is still read.
TABLE_LENGTHS, TABLE_VALUES = "lengths", "values"


@functools.cache
def table_class(hint: Any) -> type | None:
    """The item class when a record file holds a field of this hint as a table, else None."""
    if typing.get_origin(hint) is not list:
        return None
    (cls,) = typing.get_args(hint)
    if not dataclasses.is_dataclass(cls) or _flat_tuple_fields(cls) is None or _columns_decoder(cls) is None:
        return None
    return cls


def table_columns(items: list[Any], cls: type) -> dict[str, Any]:
    """The table of `items`, each column an iterator (a writer streams them); see :data:`TABLE_LENGTHS`."""
    tuples = _flat_tuple_fields(cls) or ()
    table: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        get = operator.attrgetter(f.name)
        if f.name in tuples:
            table[f.name] = {TABLE_LENGTHS: map(len, map(get, items)),
                             TABLE_VALUES: itertools.chain.from_iterable(map(get, items))}
        else:
            table[f.name] = map(get, items)
    return table


def encode_record(record: Record) -> dict[str, Any]:
    """The JSON document a record file holds: :func:`encode`, with the lists of flat dataclasses as tables."""
    hints = typing.get_type_hints(Record)
    document = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        cls = table_class(hints[f.name])
        document[f.name] = encode(value) if cls is None else _listed(table_columns(value, cls))
    return document


def _listed(table: dict[str, Any]) -> dict[str, Any]:
    return {name: _listed(column) if isinstance(column, dict) else list(column) for name, column in table.items()}


def _table_decoder(cls: type, item: Decoder) -> Decoder:
    """A table's rows: every column checked whole, in C; a column that does not pass (or a row's value the
    checks cannot judge) sends the rows to the item decoder, which names the first problem."""
    hints = typing.get_type_hints(cls, include_extras=True)
    tuples = _flat_tuple_fields(cls) or ()
    fields = [(f.name, f.default, _column_check(hints[f.name])) for f in dataclasses.fields(cls)]
    names = [name for name, *_ in fields]
    adopt = cls.__dataclass_params__.frozen and not hasattr(cls, "__post_init__")  # else its __init__ is fast
    build = _adopted_rows(cls, names) if adopt else lambda values: list(map(cls, *values))

    def decode_table(data: dict[str, Any]) -> list[Any]:
        raw = {}
        for name, _, _ in fields:
            if name in data:
                raw[name] = _table_column(data.pop(name), name, name in tuples, hints[name])
        rows = _table_length(raw)
        values = []
        for name, default, check in fields:
            if name not in raw and default is dataclasses.MISSING:
                raise SchemaError(f"missing column {name!r}")
            column = raw[name] if name in raw else [default] * rows
            checked = column if isinstance(column, _Rows) and column.checked else check(column)
            if checked is None:
                return _items(_row_objects(raw, names, rows), item)
            values.append(checked)
        data.clear()
        return build(values)

    return decode_table


class _Rows(list):
    """A tuple field's column split into its rows: tuples when every item passed its check (``checked``),
    else lists, for the item decoder to judge."""

    checked = False


def _table_column(column: Any, name: str, is_tuple: bool, hint: Any) -> list[Any]:
    try:
        if not is_tuple:
            _expect(column, list)
            return column
        return _split_rows(column, _int_bounds(typing.get_args(hint)[0]) or DEFAULT_BOUNDS)
    except SchemaError as exc:
        raise exc.at(f".{name}") from None


def _split_rows(column: Any, bounds: Bounds) -> _Rows:
    _expect(column, dict)
    lengths, values = column.get(TABLE_LENGTHS), column.get(TABLE_VALUES)
    if type(lengths) is not list or type(values) is not list or set(column) != {TABLE_LENGTHS, TABLE_VALUES}:
        raise SchemaError(f"expected an object of {TABLE_LENGTHS!r} and {TABLE_VALUES!r} lists")
    if not _all_ints_in(lengths, Bounds(0, len(values))) or sum(lengths) != len(values):
        raise SchemaError(f"its {TABLE_LENGTHS} do not add up to its {TABLE_VALUES}")
    ends = list(itertools.accumulate(lengths))
    rows = map(values.__getitem__, map(slice, [0, *ends[:-1]], ends))
    checked = _all_ints_in(values, bounds)
    split = _Rows(map(tuple, rows) if checked else rows)
    split.checked = checked
    return split


def _table_length(raw: dict[str, list[Any]]) -> int:
    lengths = set(map(len, raw.values()))
    if len(lengths) > 1:
        raise SchemaError(f"its columns have different lengths ({min(lengths)} to {max(lengths)})")
    return lengths.pop() if lengths else 0


def _row_objects(raw: dict[str, list[Any]], names: list[str], rows: int) -> list[dict[str, Any]]:
    """The table as the objects of format 1, each without the fields the table left out."""
    columns = [raw.get(name, [_ABSENT] * rows) for name in names]
    columns = [list(map(list, column)) if isinstance(column, _Rows) else column for column in columns]
    return [{name: value for name, value in zip(names, row) if value is not _ABSENT} for row in zip(*columns)]


def _adopted_rows(cls: type, names: list[str]) -> Callable[[list[list[Any]]], list[Any]]:
    """Rows of a frozen dataclass from its checked columns, without its slow ``__init__`` (see _adopt)."""
    def build(values: list[list[Any]]) -> list[Any]:
        return list(map(_adopt, itertools.repeat(cls), map(dict, map(zip, itertools.repeat(names), zip(*values)))))
    return build


def _column_check(hint: Any) -> Callable[[list[Any]], "list[Any] | None"] | None:
    """For one field's values over many items: the values (tuples for a tuple hint) when every one is
    what the single-value decoder would return unchanged, else None. None for hints without a check."""
    ints = _int_bounds(hint)
    if ints is not None:
        return lambda column: column if _all_ints_in(column, ints) else None
    if hint in (str, bool):
        return lambda column: column if set(map(type, column)) <= {hint} else None
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and set(typing.get_args(hint)) == {str, type(None)}:
        return lambda column: column if set(map(type, column)) <= {str, type(None)} else None
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item_bounds = _int_bounds(args[0])
        if item_bounds is not None:
            return lambda column: (list(map(tuple, column)) if set(map(type, column)) <= {list}
                                   and _all_ints_in(list(itertools.chain.from_iterable(column)), item_bounds)
                                   else None)
    return None


def _int_bounds(hint: Any) -> Bounds | None:
    """The bounds of an int hint (plain or ``Annotated``), None for any other hint."""
    if hint is int:
        return DEFAULT_BOUNDS
    if typing.get_origin(hint) is typing.Annotated and typing.get_args(hint)[0] is int:
        return next((extra for extra in typing.get_args(hint)[1:] if isinstance(extra, Bounds)), DEFAULT_BOUNDS)
    return None


def _all_ints_in(data: Any, bounds: Bounds) -> bool:
    """A list of ints within bounds, checked in C (a record's stacks hold millions of frame indices); on
    False the item-by-item decoder names what is wrong."""
    return (type(data) is list and set(map(type, data)) <= {int}
            and (not data or (bounds.low <= min(data) and max(data) <= bounds.high)))


def _tuple_decoder(args: tuple[Any, ...]) -> Decoder:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])
        ints = _int_bounds(args[0])
        if ints is not None:
            return lambda data: tuple(data) if _all_ints_in(data, ints) else tuple(_items(data, item))
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
    key_decoder = _key_decoder(key_hint)
    value_decoder = _decoder(value_hint)

    def decode_dict(data: Any) -> dict[Any, Any]:
        _expect(data, dict)
        result = {}
        for key, item in data.items():
            try:
                result[key_decoder(key)] = value_decoder(item)
            except SchemaError as exc:
                raise exc.at(f"[{key[:40]!r}]") from None  # a key can be megabytes long
        return result

    return decode_dict


_CONTAINERS = {list: _list_decoder, tuple: _tuple_decoder, dict: _dict_decoder}


def _key_decoder(hint: Any) -> Decoder:
    """JSON object keys are strings; int keys (pids) are decoded from their digits, then range-checked."""
    base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
    if base is not int:
        return _decoder(hint)
    value_decoder = _decoder(hint)

    def decode_int_key(key: str) -> int:
        if not INT_KEY.fullmatch(key):
            raise SchemaError("key is not an integer")
        return value_decoder(int(key))

    return decode_int_key


def _dataclass_decoder(cls: type) -> Decoder:
    hints = typing.get_type_hints(cls, include_extras=True)
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


def _decode_scalar(data: Any, hint: Any, bounds: Bounds = DEFAULT_BOUNDS) -> Any:
    if hint is Any:
        return data
    if hint is bytes:
        _expect(data, str)
        try:
            return bytes.fromhex(data)
        except ValueError:
            raise SchemaError("not hex bytes") from None
    if hint is float and type(data) is int:
        data = float(_in_bounds(data, bounds))
    if type(data) is not hint:
        raise SchemaError(f"expected {getattr(hint, '__name__', hint)}, got {type(data).__name__}")
    if hint is int:
        return _in_bounds(data, bounds)
    if hint is float and not (math.isfinite(data) and bounds.low <= data <= bounds.high):
        raise SchemaError(f"{_shown(data)} is out of range {bounds.low}..{bounds.high}")
    return data


def _in_bounds(number: int, bounds: Bounds) -> int:
    if not bounds.low <= number <= bounds.high:
        raise SchemaError(f"{_shown(number)} is out of range {bounds.low}..{bounds.high}")
    return number


def _shown(number: int | float) -> str:
    """A number for an error message: never thousands of digits."""
    text = repr(number)
    return text if len(text) <= 24 else f"a {len(text)}-digit number"


def _expect(data: Any, kind: type) -> None:
    if type(data) is not kind:
        raise SchemaError(f"expected {kind.__name__}, got {type(data).__name__}")


def _check_frame_indices(record: Record) -> None:
    count = len(record.frames)
    for name, field in ((".samples", "frames"), (".off_cpu", "frames"), (".wakeups", "frames"),
                        (".wakeups", "waker_frames")):
        samples = getattr(record, name[1:])
        stacks = map(operator.attrgetter(field), samples)
        if max(itertools.chain.from_iterable(stacks), default=-1) < count:  # the decoder checked for >= 0
            continue
        for i, sample in enumerate(samples):  # find the first bad one, to name it
            frames = getattr(sample, field)
            if frames and max(frames) >= count:  # the decoder checked them for >= 0
                raise SchemaError("frame index out of range", (name, f"[{i}]") + ((f".{field}",) if field != "frames" else ()))
