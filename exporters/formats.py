"""Every output optrace prints, by name: the one place a format is registered.

A format is a module of ``optrace.exporters`` with one function, ``write(stream, model, options)``: it
writes the model (a profile, a count, a comparison, an annotation, a top refresh, a JIT file's listing) as
text to the stream, as the options say (None for a model that carries its own). A new format is that
module and one line in the table of its output below; ``--format`` takes its choices from there.
Commands, top and serve reach a writer only through this registry (tests/test_architecture.py).

A report format makes its whole text before writing any of it: the output budget
(:mod:`optrace.exporters.budget`) stops a report built from a hostile record before anything is printed.

A format's module is imported only when it is used: report's start-up time is part of its benchmark.
"""
from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Generic, Protocol, TextIO, TypeVar, cast

from optrace.errors import OptraceError

if TYPE_CHECKING:
    from optrace.frontend.report.annotation import AnnotateOptions, AnnotateView
    from optrace.frontend.report.callcounts import CountOptions, CountReport
    from optrace.frontend.report.diff import Comparison
    from optrace.frontend.report.jitlisting import Listing
    from optrace.frontend.report.rows import Profile, ReportOptions
    from optrace.frontend.report.toprows import TopSnapshot

Model = TypeVar("Model", contravariant=True)
Options = TypeVar("Options", contravariant=True)


class Writer(Protocol[Model, Options]):
    """A format's ``write``."""

    def __call__(self, stream: TextIO, model: Model, options: Options, /) -> None: ...


class Formats(Generic[Model, Options]):
    """The formats of one output: format name -> the module whose ``write`` prints it."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self._modules = dict(modules)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._modules)

    def check(self, name: str) -> str:
        if name not in self._modules:
            raise OptraceError(f"unknown format {name!r}: valid formats are {', '.join(self._modules)}")
        return name

    def writer(self, name: str) -> Writer[Model, Options]:
        return cast(Writer[Model, Options], import_module(self._modules[self.check(name)]).write)


PROFILE: Formats[Profile, ReportOptions] = Formats({  # optrace report --format
    "table": "optrace.exporters.table",
    "json": "optrace.exporters.jsonrows",
    "csv": "optrace.exporters.csvrows",
    "folded": "optrace.exporters.folded",
    "flamegraph": "optrace.exporters.flamegraph",
    "svg": "optrace.exporters.flamesvg",
    "pprof": "optrace.exporters.pprof",
    "otlp": "optrace.exporters.otlp",
})
CALL_GRAPH: Formats[Profile, ReportOptions] = Formats({  # optrace report -G caller|callee --format
    "table": "optrace.exporters.callgraph",
    "json": "optrace.exporters.callgraphjson",
    "flamegraph": "optrace.exporters.flamegraph",
    "svg": "optrace.exporters.flamesvg",
})
CALL_COUNTS: Formats[CountReport, CountOptions] = Formats({  # optrace count --format
    "table": "optrace.exporters.counttable",
    "json": "optrace.exporters.countjson",
})
DIFF: Formats[Comparison, ReportOptions] = Formats({  # optrace diff --format
    "table": "optrace.exporters.difftable",
    "json": "optrace.exporters.diffjson",
    "flamegraph": "optrace.exporters.diffflamegraph",
})
JIT_LISTING: Formats[Listing, None] = Formats({  # optrace jit show
    "listing": "optrace.exporters.jitlisting",
})
ANNOTATE: Formats[AnnotateView, AnnotateOptions] = Formats({  # optrace annotate --format
    "stdio": "optrace.exporters.annotatetext",
    "json": "optrace.exporters.annotatejson",
})
TOP: Formats[TopSnapshot, None] = Formats({  # optrace top --stdio (the full-screen view is frontend/top/screen.py)
    "stdio": "optrace.exporters.toptext",
})
