"""`optrace serve`'s settings once checked (frontend/serve/config.py reads them from flags and files), and
their defaults."""
from __future__ import annotations

from dataclasses import dataclass, field

from optrace.defaults import DEFAULT_CALL_GRAPH, DEFAULT_FREQUENCY_HZ
from optrace.frontend.serve.httpserver import ListenAddress
from optrace.frontend.serve.otlpconfig import OtlpOptions
from optrace.frontend.serve.totals import DEFAULT_SERIES_IDLE_S
from optrace.frontend.serve.webconfig import WebConfig

DEFAULT_PORT = 9469
DEFAULT_MAX_SERIES = 10000
# CFI unwinding, as record's default. Its tables are converted in a child process (SessionMode.
# unwind_in_child): converting them on a thread of serve's interpreter stopped the drain loop for 12-18 s
# in tests/hostile's live test (the GIL, shared with the drain naming hostile files).
SERVE_CALL_GRAPH = DEFAULT_CALL_GRAPH


@dataclass
class ServeOptions:
    listen: ListenAddress = field(default_factory=lambda: ListenAddress("127.0.0.1", DEFAULT_PORT))
    frequency_hz: int = DEFAULT_FREQUENCY_HZ
    uprobes: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    subprocesses: bool = False  # with pids: their descendants too (target.with_subprocesses)
    comms: list[str] = field(default_factory=list)
    max_series: int = DEFAULT_MAX_SERIES
    series_idle_s: float = DEFAULT_SERIES_IDLE_S  # 0: series never expire
    web: WebConfig = field(default_factory=WebConfig)
    drain_interval_s: float = 1.0
    off_cpu: bool = False  # also export optrace_offcpu_seconds_total
    off_cpu_every: int = 1  # N: one wait in N recorded, counted N times (OffCpuOptions.every)
    call_graph: str = SERVE_CALL_GRAPH  # how user stacks are walked (SessionOptions.call_graph)
    python: bool = True  # Python frames (SessionOptions.python)
    python_internals: bool = False  # the interpreter's frames as they are, not folded (report/pythonview.py)
    otlp: OtlpOptions | None = None  # OTLP push (frontend/serve/otlpexport.py); None: off
