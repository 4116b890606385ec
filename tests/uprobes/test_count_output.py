"""count's table and JSON: names from other users' binaries and processes never reach the terminal raw."""
from __future__ import annotations

import io
import json

from optrace.exporters import countjson, counttable
from optrace.frontend.report.callcounts import CountOptions, CountReport, ProbeCalls
from optrace.model import CallCount

EVIL = "evil\x1b]0;pwned\x07\x1b[2J"


def report() -> CountReport:
    count = CallCount(probe=f"/tmp/{EVIL}:f", binary=f"/tmp/{EVIL}", symbol=EVIL, offset=0x1139, calls=7,
                      per_pid={42: 7}, comms={42: EVIL})
    probe = ProbeCalls(spec=count.probe, binary=count.binary, symbol=count.symbol, offset=count.offset,
                       aliases=(), glob=False, count=count)
    return CountReport(probes=[probe], elapsed_s=1.0)


def test_table_escapes_names_and_keeps_one_line_per_row() -> None:
    out = io.StringIO()
    counttable.write(out, report(), CountOptions(per_pid=True))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J" in text
    assert len(text.splitlines()) == 4  # header, the probe, its pid, the footer


def test_json_keeps_the_names_exact() -> None:
    out = io.StringIO()
    countjson.write(out, report(), CountOptions(per_pid=True))
    assert "\x1b" not in out.getvalue()
    [probe] = json.loads(out.getvalue())["probes"]
    assert (probe["symbol"], probe["binary"], probe["per_pid"][0]["comm"]) == (EVIL, f"/tmp/{EVIL}", EVIL)


def _with_calls(calls: int, per_pid: dict[int, int], elapsed: float) -> CountReport:
    base = report()
    probe = base.probes[0]
    count = CallCount(probe.spec, probe.binary, probe.symbol, probe.offset, calls, per_pid, {})
    return CountReport(probes=[ProbeCalls(probe.spec, probe.binary, probe.symbol, probe.offset, (), False, count)],
                       elapsed_s=elapsed)


def test_an_interval_is_the_difference_of_two_reads() -> None:
    """count -i prints each interval's calls (funccount's way); the intervals add up to the total."""
    from optrace.frontend.report.callcounts import interval_report

    first, second = _with_calls(10, {1: 10}, 1.0), _with_calls(25, {1: 12, 2: 13}, 2.0)
    assert interval_report(first, None).probes[0].count.calls == 10
    delta = interval_report(second, first)
    assert delta.interval and delta.elapsed_s == 1.0
    assert (delta.probes[0].count.calls, delta.probes[0].count.per_pid) == (15, {1: 2, 2: 13})
    out = io.StringIO()
    counttable.write(out, delta, CountOptions(interval_mark=True))
    assert "calls in the last 1.0 s (per interval; --cumulative for running totals)" in out.getvalue()
    out = io.StringIO()
    counttable.write(out, second, CountOptions(interval_mark=True))
    assert "calls since the start, 2.0 s (totals)" in out.getvalue()
    out = io.StringIO()
    countjson.write(out, delta, CountOptions())
    assert json.loads(out.getvalue())["counts"] == "interval"
