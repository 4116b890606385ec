"""`optrace serve`'s engine: drain the sources on a fixed period into the totals, serve them over HTTP.

The drain period, not the scrapes, moves the counters: a scrape only reads the totals, so any number
of scrapers at any interval see the same monotonic counters. Everything started here is closed
here, whatever way the loop ends (stop request, exception). A source whose drain raises costs that
drain's rows of that source (counted in ``optrace_read_errors_total{kind="drain"}``), never the
daemon. A reload (SIGHUP) re-reads the settings between two drains: the web config (TLS, users,
headers) and the series idle time apply at once; settings that shape the BPF side or the guard (listen,
frequency, uprobes, pids, comms, max_series, off-CPU, call_graph, python, python_internals, the OTLP push's)
need a restart, and a change to them is warned about and left as it was. A reload that fails keeps the running
settings and is an error line: a settings file that is empty, invalid or writable by another user
(settingsfile.py) is refused. With OTLP push on, each drain's whole stacks also go to the exporter
(frontend/serve/otlpexport.py), which sends on a thread of its own: a drain never waits for the network.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from typing import Protocol

from optrace.containment import contain, count_failure
from optrace.errors import OptraceError
from optrace.frontend.serve.httpserver import ListenAddress, MetricsServer
from optrace.frontend.serve.metricspage import ExporterInfo, MetricsPage
from optrace.frontend.serve.options import ServeOptions
from optrace.frontend.serve.otlpexport import OtlpExporter
from optrace.frontend.serve.profilewindows import ProfileWindows
from optrace.frontend.serve.source import Source
from optrace.frontend.serve.totals import Delta, ExporterTotals
from optrace.heap import release_free_memory

RESTART_ONLY = ("listen", "frequency_hz", "uprobes", "pids", "subprocesses", "comms", "max_series", "off_cpu",
                "off_cpu_every", "call_graph", "python", "python_internals", "otlp")
# glibc's free heap given back this often: table and symbol loads of a churning machine's processes free blocks
# in the middle of the heap, which glibc keeps (root's serve here: 10-34 MB free in a 38-77 MB heap, issue 40)
TRIM_EVERY_S = 60.0
WARNINGS_REMEMBERED = 1000  # a warning repeated within the last this-many distinct ones is not printed again
DRAIN_FAILED = 'counted in optrace_read_errors_total{kind="drain"}'
OTLP_FAILED = 'this drain\'s stacks are not in the OTLP profile; counted in optrace_read_errors_total{kind="otlp"}'


class StopRequest(Protocol):
    def wait(self, seconds: float) -> bool: ...  # True once a stop was requested


class ServeDaemon:
    def __init__(self, options: ServeOptions, sources: list[Source],
                 on_warning: Callable[[str], None] = lambda message: None,
                 reload: Callable[[], ServeOptions] | None = None,
                 on_info: Callable[[str], None] = lambda message: None,
                 reload_requested: threading.Event | None = None,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.options = options
        self._on_warning = on_warning
        self._on_error = on_error or on_warning  # a refused reload: serve goes on, but nothing was applied
        self._on_info = on_info
        self._reload_options = reload
        self._reload_requested = reload_requested or threading.Event()
        self._warned: OrderedDict[str, None] = OrderedDict()
        self.sources = sources
        self.totals = ExporterTotals(options.max_series, options.series_idle_s)
        self.windows = ProfileWindows(options.frequency_hz, lambda: next((s.event for s in self.sources if s.event), ""))
        self.otlp = OtlpExporter(options.otlp, options.frequency_hz) if options.otlp is not None else None
        self.address: ListenAddress | None = None
        self._server: MetricsServer | None = None

    def request_reload(self) -> None:
        """Ask for a reload at the next wake of the drain loop (safe from a signal handler)."""
        self._reload_requested.set()

    def run(self, stop: StopRequest, on_ready: Callable[[str], None] = lambda url: None) -> None:
        """Serve until ``stop`` says so. The port is taken before the (slow) BPF compile, so a busy
        port fails at once; scrapes are answered from the first drain on."""
        with ExitStack() as stack:
            server = self._server = MetricsServer(self.options.listen, self.options.web)
            stack.callback(server.close)
            stack.callback(self.windows.stop)  # first of the two: waiting profile requests get their 503
            for source in self.sources:
                stack.callback(source.close)
                source.start()
            events = [s.event for s in self.sources if s.event]
            page = MetricsPage(self.totals, ExporterInfo(self.options.frequency_hz, events[0] if events else "none"))
            page.add_collector(server.collector())
            if self.otlp is not None:
                stack.callback(self.otlp.close)  # before the sources: its last interval is sent first
                self.otlp.start()
                page.add_collector(self.otlp.collector())
            server.start(page.render, self.windows, page.current)
            self.address = server.address
            on_ready(server.url)
            self._loop(stop)

    def _loop(self, stop: StopRequest) -> None:
        interval = self.options.drain_interval_s
        next_drain = time.monotonic() + interval
        next_trim = time.monotonic() + TRIM_EVERY_S
        while not stop.wait(min(next_drain - time.monotonic(), interval)):
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()
            if time.monotonic() >= next_drain:
                self.drain_once()
                next_drain = max(next_drain + interval, time.monotonic())
            if time.monotonic() >= next_trim:
                release_free_memory()
                next_trim = time.monotonic() + TRIM_EVERY_S

    def drain_once(self) -> None:
        started = time.perf_counter()
        pushing = self.otlp is not None  # OTLP push and pprof windows share one way to whole stacks
        delta = Delta(want_stacks=self.windows.active() or pushing, want_off_cpu_stacks=pushing)
        for source in self.sources:
            contain(partial(source.collect, delta),
                    lambda exc: count_failure(delta.read_errors, delta.warnings, "drain", exc, DRAIN_FAILED))
        self.windows.drained(delta.stacks, time.monotonic())
        if self.otlp is not None:
            contain(partial(self.otlp.drained, delta),
                    lambda exc: count_failure(delta.read_errors, delta.warnings, "otlp", exc, OTLP_FAILED))
            delta.warnings.extend(self.otlp.take_warnings())
        self.totals.apply(delta, drain_seconds=time.perf_counter() - started)
        for message in delta.warnings:
            self.warn(message)

    def warn(self, message: str) -> None:
        """Print a warning unless it was printed recently (a broken file warns once, not every drain)."""
        if message in self._warned:
            self._warned.move_to_end(message)
            return
        self._warned[message] = None
        if len(self._warned) > WARNINGS_REMEMBERED:
            self._warned.popitem(last=False)
        self._on_warning(message)

    def reload(self) -> None:
        """Re-read the settings (see the module docstring); never raises."""
        if self._reload_options is None:
            self._on_info("reload requested: nothing to reload")
            return
        try:
            new = self._reload_options()
            if self._server is not None:
                self._server.configure(new.web)
        except OptraceError as exc:
            self._on_error(f"reload failed, still serving with the previous settings: {exc}")
            return
        except Exception as exc:  # a bug in reading settings must not take the daemon down either
            self._on_error(f"reload failed, still serving with the previous settings: internal error: {exc!r}")
            return
        for name in RESTART_ONLY:
            if getattr(new, name) != getattr(self.options, name):
                self._on_warning(f"reload: {name} changed, which takes a restart of optrace serve: left as it was")
                setattr(new, name, getattr(self.options, name))
        self.totals.set_series_idle(new.series_idle_s)
        new.drain_interval_s = self.options.drain_interval_s
        self.options = new
        self._on_info(f"reloaded the settings: serving {self._server.url if self._server else '(not started)'}")
