"""`optrace annotate --format json`: ``{"function": {...}, "instructions": [...]}`` for one function, or
``{"functions": [...]}`` without a symbol. Names are the record's own (JSON escapes them itself)."""
from __future__ import annotations

import dataclasses
import json
from typing import TextIO

from optrace.frontend.report.annotation import AnnotateOptions, AnnotateView


def write(stream: TextIO, view: AnnotateView, options: AnnotateOptions) -> None:
    if view.python is not None:
        annotation = dataclasses.asdict(view.python)
        document = {"source": view.source, "function": annotation, "lines": annotation.pop("lines")}
    elif view.annotation is None:
        document = {"source": view.source, "functions": [dataclasses.asdict(row) for row in view.listing or []]}
    else:
        annotation = dataclasses.asdict(view.annotation)
        instructions = annotation.pop("instructions")
        document = {"source": view.source, "function": annotation, "instructions": instructions}
    stream.write(json.dumps(document, indent=1) + "\n")
