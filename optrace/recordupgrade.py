"""Record files of formats 1-3 read as format 4: the parsed JSON document rewritten before it is decoded.

Format 4 (issue 44's runtime seam) gave each frame a kind (:data:`optrace.model.NATIVE`, ``KERNEL``, ``JIT_MAP``
or a runtime's) in place of the ``kernel`` and ``python`` columns, the runtimes' counts one table
(``RecordMeta.runtimes``) in place of ``meta.python`` and ``meta.interpreters``, and the runtimes' source lines
one list (``Record.sources``) in place of ``python_sources``. Before format 4 the only runtime was CPython
(format 3): its frames, counts and sources are read as the ``cpython`` runtime's. A document that is not what
an older optrace wrote is refused as the decoder refuses it (a column of the wrong type, or of another length).
"""
from __future__ import annotations

from typing import Any

from optrace.model import JIT_MAP, KERNEL, NATIVE
from optrace.schema import SchemaError

FIRST_WITH_KINDS = 4
OLD_RUNTIME = "cpython"  # the one runtime of format 3 (the registry's name for it, frontend/runtimes/registry.py)
OLD_NAMED = "python"  # format 3's meta.python outcome for samples with Python frames: RuntimeCounts' "named"


def upgraded(document: Any, version: int) -> Any:
    """``document`` (a record file's JSON, as parsed) as format 4 holds the same record."""
    if version >= FIRST_WITH_KINDS or type(document) is not dict:
        return document
    frames = document.get("frames")
    if type(frames) is dict:
        _table_kinds(frames)
    elif type(frames) is list:
        for frame in frames:
            if type(frame) is dict:
                frame["kind"] = _kind(frame.pop("kernel", False), frame.pop("python", False), frame.get("dso"))
    meta = document.get("meta")
    if type(meta) is dict:
        samples, processes = meta.pop("python", None), meta.pop("interpreters", None)
        if samples or processes:
            if type(samples) is dict and OLD_NAMED in samples:
                samples["named"] = samples.pop(OLD_NAMED)
            meta["runtimes"] = {OLD_RUNTIME: {"language": "Python", "product": "CPython", "samples": samples or {},
                                              "processes": processes or {}}}
    if "python_sources" in document:
        document["sources"] = document.pop("python_sources")
    return document


def _table_kinds(frames: dict[str, Any]) -> None:
    """The frames table's ``kind`` column from its ``kernel``, ``python`` and ``dso`` columns."""
    dsos = frames.get("dso")
    if type(dsos) is not list:
        return  # the decoder names the problem
    rows = len(dsos)
    columns = []
    for name in ("kernel", "python"):
        column = frames.pop(name, [False] * rows)
        if type(column) is not list or len(column) != rows:
            raise SchemaError(f"column {name!r} is not a list of {rows} rows", (".frames",))
        columns.append(column)
    frames["kind"] = list(map(_kind, *columns, dsos))


def _kind(kernel: Any, python: Any, dso: Any) -> str:
    if kernel is True:
        return KERNEL
    if python is True:
        return OLD_RUNTIME
    return JIT_MAP if type(dso) is str and dso.startswith("[jit]") else NATIVE
