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
