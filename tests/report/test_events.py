"""report --event on synthetic records: the off-CPU and wall views, their units and errors (no BPF)."""
from __future__ import annotations

import dataclasses
import gzip
import json
import re

import pytest

from optrace.errors import OptraceError
from optrace.frontend.recorder import merged_frames
from optrace.frontend.report.events import event_record, human_time
from optrace.frontend.report.rows import Profile, ReportOptions
from optrace.kernel import kernel_version
from optrace.model import Frame, OffCpuMeta, Record, RecordMeta, Sample
from optrace.recordfile import read_record, write_record
from profiletext import render_report

MS = 1_000_000


def make_record(wall: bool = True) -> Record:
    meta = RecordMeta(optrace_version="t", hostname="h", kernel="k", started=0.0, duration_s=1.0, frequency_hz=100,
                      event="cpu-clock", off_cpu=OffCpuMeta("raw tracepoint sched_switch", 1, [], 900 * MS, wall=wall))
    frames = [Frame("burn", "/bin/w"), Frame("wait_pipe", "/bin/w"), Frame("__schedule", "[kernel.kallsyms]", "kernel")]
    cpu = [Sample(1, "w", (0,), 10, 0)]  # 10 samples at 100 Hz: 100 ms on CPU
    off = [Sample(1, "w", (2, 1), 600 * MS, 2), Sample(1, "w", (2, 0), 300 * MS, 3)]
    return Record(meta=meta, frames=frames, samples=cpu, off_cpu=off)


def test_off_cpu_view_counts_nanoseconds_per_thread() -> None:
    record, parts = event_record(make_record(), "off-cpu")
    doc = json.loads(render_report(record, ReportOptions(sort=("tid",), children=True), "json", "f", event="off-cpu"))
    assert (doc["report"]["unit"], doc["report"]["total"], parts) == ("nanoseconds", 900 * MS, {})
    assert [(row["tid"], row["nanoseconds"], row["samples"]) for row in doc["rows"]] == [
        (2, 600 * MS, None), (3, 300 * MS, None)]


def test_wall_view_adds_cpu_samples_as_periods() -> None:
    record, parts = event_record(make_record(), "wall")
    assert parts == {"on-cpu": 100 * MS, "off-cpu": 900 * MS}
    text = render_report(record, ReportOptions(sort=("symbol",), children=True), "table", "f", event="wall",
                         parts=parts)
    assert "# on-cpu 100 ms (10.00%), off-cpu 900 ms (90.00%)" in text
    line = next(line for line in text.splitlines() if line.endswith("[.] burn"))
    assert line.split()[:4] == ["40.00%", "10.00%", "400", "ms"]


def test_views_a_record_cannot_give_are_refused() -> None:
    with pytest.raises(OptraceError, match="record with --wall"):
        event_record(make_record(wall=False), "wall")
    cpu_only = dataclasses.replace(make_record(), off_cpu=[], meta=dataclasses.replace(make_record().meta, off_cpu=None))
    with pytest.raises(OptraceError, match="--off-cpu"):
        event_record(cpu_only, "off-cpu")


def test_off_cpu_round_trips_and_bad_indices_are_refused(tmp_path) -> None:
    path = tmp_path / "r.data"
    write_record(make_record(), path)
    assert read_record(path) == make_record()
    bad = make_record()
    bad.off_cpu[0].frames = (7,)
    write_record(bad, path)
    with pytest.raises(OptraceError, match=r"off_cpu\[0\]: frame index out of range"):
        read_record(path)


@pytest.mark.parametrize("event,kind", [("off-cpu", "off_cpu"), ("wall", "wall")])
def test_pprof_carries_the_unit(event: str, kind: str) -> None:
    from optrace.exporters.pprof import encode
    from optrace.exporters.pprofproto import profile_pb2

    record, _ = event_record(make_record(), event)
    message = profile_pb2.Profile.FromString(gzip.decompress(encode(record, ReportOptions(), "f", event=event)))
    strings = message.string_table
    assert [(strings[t.type], strings[t.unit]) for t in message.sample_type] == [(kind, "nanoseconds")]
    assert strings[message.default_sample_type] == kind
    values = sorted(sample.value[0] for sample in message.sample)
    assert values[-2:] == [300 * MS, 600 * MS]
    tids = {label.num for sample in message.sample for label in sample.label if strings[label.key] == "tid"}
    assert tids == {2, 3}


def test_merged_frames_share_one_table() -> None:
    frames, rows = merged_frames([Frame("a", "x")], [Frame("b", "x"), Frame("a", "x")], [Sample(1, "c", (0, 1), 5, 9)])
    assert frames == [Frame("a", "x"), Frame("b", "x")]
    assert rows == [Sample(1, "c", (1, 0), 5, 9)]


@pytest.mark.parametrize("ns,shown", [(0, "0 ns"), (999, "999 ns"), (1500, "1.50 us"), (45_600_000, "45.6 ms"),
                                      (1_234_000_000, "1.23 s"), (250 * 10**9, "250 s")])
def test_human_time(ns: int, shown: str) -> None:
    assert human_time(ns) == shown


def test_kernel_version() -> None:
    assert kernel_version("6.18.44-fc-v509") == (6, 18)
    assert kernel_version("5.4.0-rc1") == (5, 4)
    assert kernel_version("weird") == (0, 0)


def test_flame_graph_of_off_cpu_time_says_time(optrace, tmp_path) -> None:
    """In headless Chromium, as people see it: the header's Time, the match line, the search's list and the
    hottest functions' column in times, the shares; the SVG's tooltips too."""
    import xml.etree.ElementTree as ET

    from browser import dump_dom, read_page, share

    data, out, svg = tmp_path / "off.data", tmp_path / "off.html", tmp_path / "off.svg"
    write_record(make_record(), data)
    optrace("report", "-i", str(data), "--event", "off-cpu", "-f", "flamegraph", "-o", str(out), check=True)
    dom = dump_dom(out, "#search=wait_pipe")
    page = read_page(dom)
    assert page.match == "Matched: 600 ms, 66.67% of all"
    assert page.matches == [["66.67%", "600 ms", "wait_pipe", "/bin/w"]]
    assert share(page, "wait_pipe") == 66.67 and share(page, "burn") == 33.33
    assert ["33.33%", "0.00%", "300 ms", "burn", "/bin/w"] in page.top
    assert re.search(r"<thead><tr><th>Total</th><th>Self</th><th>Time</th>", dom)
    assert "Time900 ms of off-cpu (counts in nanoseconds)" in re.sub(r"<[^>]+>", "", dump_dom(out))
    optrace("report", "-i", str(data), "--event", "off-cpu", "-f", "svg", "-o", str(svg), check=True)
    titles = [g.findtext("{http://www.w3.org/2000/svg}title") for g in ET.parse(svg).getroot().iter(
        "{http://www.w3.org/2000/svg}g")]
    assert titles[0] == "all (900 ms off-CPU): 900 ms off-CPU, 100.00%"
    assert "wait_pipe in /bin/w: 600 ms off-CPU, 66.67%" in titles


def test_report_shows_the_event_the_record_was_made_for(optrace, tmp_path) -> None:
    """--wall records report wall-clock time, --off-cpu ones off-CPU time, others CPU samples, in every
    format, unless --event says otherwise."""
    cpu_only = dataclasses.replace(make_record(), off_cpu=[], meta=dataclasses.replace(make_record().meta, off_cpu=None))
    for record, event, header in ((make_record(), "wall", "# Time: 1.00 s of event 'wall'"),
                                  (make_record(wall=False), "off-cpu", "# Time: 900 ms of event 'off-cpu'"),
                                  (cpu_only, "cpu", "# Samples: 10 of event 'cpu-clock'")):
        data = tmp_path / f"{event}.data"
        write_record(record, data)
        assert header in optrace("report", "-i", str(data), check=True).stdout
        assert json.loads(optrace("report", "-i", str(data), "-f", "json", check=True).stdout)["report"]["event"] == event
        folded = optrace("report", "-i", str(data), "-f", "folded", check=True).stdout
        assert folded.startswith("# optrace folded stacks: event") == (event != "cpu")
    cpu = optrace("report", "-i", str(tmp_path / "wall.data"), "-e", "cpu", check=True).stdout
    assert "# Samples: 10 of event 'cpu-clock'" in cpu


def test_footers_and_call_graphs_say_time(optrace, tmp_path) -> None:
    data = tmp_path / "off.data"
    write_record(make_record(wall=False), data)
    text = optrace("report", "-i", str(data), "--percent-limit", "50", "--comm", "w", "-s", "tid", check=True).stdout
    assert "# Matched --comm w: 900 ms off-CPU (100.00% of all)" in text
    assert "# Hidden by --percent-limit 50: 1 row with 300 ms off-CPU (33.33% of all)" in text
    graph = optrace("report", "-i", str(data), "-G", "caller", check=True).stdout
    assert "# Call graph, caller order: percentages of all 900 ms off-CPU" in graph
    assert re.search(r"^#\s+Total\s+Self\s+Time\s+Shared Object / Symbol$", graph, re.M)
    assert re.search(r"^\s+66\.67%\s+0\.00%\s+600 ms\s+w\s+\[\.\] wait_pipe$", graph, re.M), graph
    tree = json.loads(optrace("report", "-i", str(data), "-G", "callee", "-f", "json", check=True).stdout)
    assert (tree["report"]["event"], tree["report"]["unit"]) == ("off-cpu", "nanoseconds")


def test_no_cpu_samples_says_where_the_time_is(optrace, tmp_path) -> None:
    """A --wall record of an idle server has off-CPU time and no CPU samples: asked for CPU samples, report
    says where the time is instead of a bare "(no samples match)"."""
    data = tmp_path / "idle.data"
    write_record(dataclasses.replace(make_record(), samples=[]), data)
    text = optrace("report", "-i", str(data), "-e", "cpu", check=True).stdout
    assert text.rstrip().endswith("# (no CPU samples: the record's threads did not run on a CPU while sampled; "
                                  "their off-CPU time is in --event off-cpu or wall)")
    graph = optrace("report", "-i", str(data), "-e", "off-cpu", "--comm", "nobody", "-G", "caller", check=True).stdout
    assert graph.rstrip().endswith("# (no off-CPU time matches --comm nobody)")


def test_tracepoint_frames_are_left_out_of_off_cpu_stacks(optrace, tmp_path) -> None:
    """With another tracer on sched_switch the kernel stack starts in __traceiter_sched_switch: the wait is
    in __schedule and its callers, not in the tracepoint."""
    record = make_record()
    record.frames.append(Frame("__traceiter_sched_switch", "[kernel.kallsyms]", "kernel"))
    record.off_cpu = [Sample(1, "w", (3, 2, 1), 600 * MS, 2), Sample(1, "w", (2, 0), 300 * MS, 3)]
    data = tmp_path / "traced.data"
    write_record(record, data)
    for event in ("off-cpu", "wall"):
        folded = optrace("report", "-i", str(data), "-e", event, "-f", "folded", check=True).stdout
        assert "w;wait_pipe;__schedule_[k] 600000000" in folded.splitlines() and "__traceiter" not in folded
    rows = json.loads(optrace("report", "-i", str(data), "-e", "off-cpu", "-f", "json", check=True).stdout)["rows"]
    assert [(row["symbol"], row["nanoseconds"]) for row in rows] == [("__schedule", 900 * MS)]
