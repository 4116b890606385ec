"""serve's HTTP server on its own page: the connections it holds, the bytes they hold, those it cut
(connlimits.py) and its refusals (refusals.py), read at each render of the page (once per drain)."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from optrace.frontend.serve.connlimits import ConnectionLimits
from optrace.frontend.serve.metricspage import counted_by
from optrace.frontend.serve.refusals import RefusalPace


class ConnectionsCollector(Collector):
    def __init__(self, limits: ConnectionLimits, refusals: RefusalPace) -> None:
        self._limits = limits
        self._refusals = refusals

    def collect(self) -> Iterator[Metric]:
        limits = self._limits
        yield GaugeMetricFamily("optrace_http_connections", "Connections the HTTP server holds now.", value=limits.held())
        yield GaugeMetricFamily("optrace_http_connections_max", "The most it holds: a new connection past it makes "
                                "the one that made no progress for the longest give way.", value=limits.total)
        held = GaugeMetricFamily("optrace_http_held_bytes", "Bytes the connections hold now: request bytes read and "
                                 "not answered yet, answer bodies being written (each counted once).", labels=["kind"])
        held.add_metric(["request"], limits.request_held)
        held.add_metric(["answer"], limits.answer_held)
        yield held
        yield counted_by("optrace_http_connections_cut", "Connections the HTTP server cut: gave way (to a new "
                         "connection, or to others' request or answer bytes), or too slow (past a deadline).",
                         "reason", {"gave_way": limits.cut, "too_slow": limits.timed_out})
        refusals = self._refusals
        yield counted_by("optrace_http_refusals", "4xx answers (a 401 without valid credentials, a 404, a 429), "
                         "by whether they went at once or waited for their client's turn (past its burst).",
                         "pace", {"at_once": refusals.at_once, "waited": refusals.waited})
