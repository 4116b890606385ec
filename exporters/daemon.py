"""`optrace serve`'s engine: drain the sources on a fixed period into the totals, serve them over HTTP.

The drain period, not the scrapes, moves the counters: a scrape only reads the totals, so any number
of scrapers at any interval see the same monotonic counters. Everything started here is closed
here, whatever way the loop ends (stop request, exception).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Protocol

from optrace.exporters.httpserver import ListenAddress, MetricsServer, TlsFiles
from optrace.exporters.prometheus import ExporterInfo, MetricsPage
from optrace.exporters.sources import CallSource, ProfileSource, Source
from optrace.exporters.totals import Delta, ExporterTotals

DEFAULT_PORT = 9469
DEFAULT_MAX_SERIES = 10000


@dataclass
class ServeOptions:
    listen: ListenAddress = field(default_factory=lambda: ListenAddress("127.0.0.1", DEFAULT_PORT))
    frequency_hz: int = 99
    uprobes: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    comms: list[str] = field(default_factory=list)
    max_series: int = DEFAULT_MAX_SERIES
    tls: TlsFiles | None = None
    drain_interval_s: float = 1.0


class StopRequest(Protocol):
    def wait(self, seconds: float) -> bool: ...  # True once a stop was requested


def build_sources(options: ServeOptions) -> list[Source]:
    profile = ProfileSource(options.frequency_hz, options.pids, options.comms)
    sources: list[Source] = [profile]
    if options.uprobes:
        targets = profile.target_pids if options.pids else None
        sources.append(CallSource(options.uprobes, options.comms, targets))
    return sources


class ServeDaemon:
    def __init__(self, options: ServeOptions, sources: list[Source] | None = None,
                 on_warning: Callable[[str], None] = lambda message: None) -> None:
        self.options = options
        self.on_warning = on_warning
        self.sources = build_sources(options) if sources is None else sources
        self.totals = ExporterTotals(options.max_series)
        self.address: ListenAddress | None = None

    def run(self, stop: StopRequest, on_ready: Callable[[str], None] = lambda url: None) -> None:
        """Serve until ``stop`` says so. The port is taken before the (slow) BPF compile, so a busy
        port fails at once; scrapes are answered from the first drain on."""
        with ExitStack() as stack:
            server = MetricsServer(self.options.listen, self.options.tls)
            stack.callback(server.close)
            for source in self.sources:
                stack.callback(source.close)
                source.start()
            events = [s.event for s in self.sources if s.event]
            page = MetricsPage(self.totals, ExporterInfo(self.options.frequency_hz, events[0] if events else "none"))
            server.start(page.render)
            self.address = server.address
            on_ready(server.url)
            self._loop(stop)

    def _loop(self, stop: StopRequest) -> None:
        interval = self.options.drain_interval_s
        next_drain = time.monotonic() + interval
        while not stop.wait(next_drain - time.monotonic()):
            self.drain_once()
            next_drain = max(next_drain + interval, time.monotonic())

    def drain_once(self) -> None:
        started = time.perf_counter()
        delta = Delta()
        for source in self.sources:
            source.collect(delta)
        self.totals.apply(delta, drain_seconds=time.perf_counter() - started)
        for message in delta.warnings:
            self.on_warning(message)
