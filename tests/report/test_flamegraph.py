"""report --format flamegraph / svg and diff's differential graph, looked at the way people do: in
headless Chromium (DOM after the scripts ran, screenshots), and the SVG as XML."""
from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from browser import dump_dom, read_page, screenshot, share
from optrace.model import Frame, Record, Sample
from optrace.recordfile import write_record
from support import OPTRACE, assert_one_line_error

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = ['</script><script>document.title="pwned"</script>', 'say "hi" & <b>bold</b>', "<!--",
           "ctl\x1b[2J\u202eevil", "]]>"]


def hostile_record(record: Record) -> Record:
    """The synthetic record with hostile names for hot_b's function, object and command."""
    record.frames.append(Frame(HOSTILE[0], "/tmp/" + HOSTILE[1]))  # 8
    record.frames.append(Frame(HOSTILE[2], HOSTILE[3], address=1))  # 9
    record.frames.append(Frame(HOSTILE[4], "/x", kind="kernel"))  # 10
    record.samples[1] = Sample(100, HOSTILE[1], (8, 9, 0), 200)
    record.samples.append(Sample(100, "demo", (10, 0), 10))
    return record


def test_html_is_self_contained_and_shows_the_shares(optrace, record_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "flame.html"
    optrace("report", "-i", str(record_file), "--format", "flamegraph", "-o", str(out), check=True)
    text = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text) and "http://" not in text.replace(
        "http://www.w3.org", "")
    page = read_page(dump_dom(out))
    assert int(page.body["data-ready-ms"]) > 0
    assert share(page, "hot_a") == 40.0 and share(page, "hot_b") == 20.0 and share(page, "main") == 90.0
    assert share(page, "ksys_write") == 10.0
    assert "Samples1000 of cpu-clock at 499 Hz" in re.sub(r"<[^>]+>", "", dump_dom(out))


def test_search_shows_the_share_of_matches(optrace, record_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "flame.html"
    optrace("report", "-i", str(record_file), "-f", "flamegraph", "-o", str(out), check=True)
    assert read_page(dump_dom(out, "#search=hot_")).match == "Matched: 650 samples, 65.00% of all"
    assert read_page(dump_dom(out, "#search=/^lib_|write$/")).match == "Matched: 300 samples, 30.00% of all"


def test_hostile_names_stay_text(optrace, record: Record, tmp_path: Path) -> None:
    data, out, svg = tmp_path / "hostile.data", tmp_path / "flame.html", tmp_path / "flame.svg"
    write_record(hostile_record(record), data)
    optrace("report", "-i", str(data), "-f", "flamegraph", "-o", str(out), check=True)
    dom = dump_dom(out)
    page = read_page(dom)
    assert page.scripts == 4 and "pwned" not in re.search(r"<title>(.*?)</title>", dom).group(1)
    assert int(page.body["data-ready-ms"]) > 0  # the page's own script ran to the end
    assert share(page, HOSTILE[0]) == share(page, HOSTILE[2]) == 19.8  # 200 of 1010 samples
    names = {row[3] for row in page.top} | {row[4] for row in page.top}
    assert "/tmp/" + HOSTILE[1] in names and "ctl\\x1b[2J\\u202eevil" in names and HOSTILE[4] in names
    optrace("report", "-i", str(data), "-f", "svg", "-o", str(svg), check=True)
    titles = [g.find(SVG + "title").text for g in ET.parse(svg).getroot().iter(SVG + "g")]
    assert any(t.startswith(HOSTILE[0] + " in /tmp/" + HOSTILE[1]) for t in titles)
    assert any(t.startswith(HOSTILE[2] + " in ctl\\x1b[2J\\u202eevil") for t in titles)


def test_svg_widths_match_the_samples(optrace, record_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "flame.svg"
    optrace("report", "-i", str(record_file), "-f", "svg", "-o", str(out), check=True)
    root = ET.parse(out).getroot()
    width = float(root.get("width"))
    frames = list(root.iter(SVG + "g"))
    assert len(frames) == 12  # all, 2 commands, 9 frames
    for g in frames:
        samples = int(g.get("data-samples"))
        title = g.find(SVG + "title").text
        assert f": {samples} samples, {samples / 10:.2f}%" in title
        assert float(g.find(SVG + "rect").get("width")) == pytest.approx(width * samples / 1000, abs=1e-3)
    hot_a = [g for g in frames if g.find(SVG + "title").text.startswith("hot_a in /work/main")][0]
    assert hot_a.find(SVG + "text").text == "hot_a"


def test_screenshot_draws_the_graph(optrace, record_file: Path, tmp_path: Path) -> None:
    """The canvas is drawn: the screenshot has hot_a's colour over a wide area, not a blank page."""
    out, png = tmp_path / "flame.html", tmp_path / "flame.png"
    optrace("report", "-i", str(record_file), "-f", "flamegraph", "-o", str(out), check=True)
    screenshot(out, png, fragment="#search=hot_a")
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_unwritable_output(optrace, record_file: Path, tmp_path: Path) -> None:
    for fmt in ("flamegraph", "svg"):
        proc = optrace("report", "-i", str(record_file), "-f", fmt, "-o", str(tmp_path / "no" / "such" / "f"))
        assert_one_line_error(proc, "cannot write")


def test_a_repeated_long_name_is_stored_once(tmp_path: Path, record: Record) -> None:
    """The output budget's 30 KB file (a 30 MB symbol in 200 stacks): the page holds the name once,
    so it is written, about 60 MB, in bounded time and memory."""
    frame = Frame("s" * 30_000_000, "/lib/" + "d" * 30_000_000)
    samples = [Sample(pid=1, comm=f"c{i}", frames=(0,), count=1) for i in range(200)]
    write_record(Record(meta=record.meta, frames=[frame], samples=samples), tmp_path / "amplified.data")
    out, measured = tmp_path / "flame.html", tmp_path / "time"
    result = subprocess.run(["/usr/bin/time", "-o", str(measured), "-f", "%U %S %M", str(OPTRACE), "report",
                             "-i", str(tmp_path / "amplified.data"), "-f", "flamegraph", "-o", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    user, system, peak_kb = measured.read_text().split()[-3:]
    assert 60_000_000 < out.stat().st_size < 61_000_000
    assert int(peak_kb) < 400 << 10 and float(user) + float(system) < 5


def test_vendored_inflater_is_the_pinned_fflate() -> None:
    """exporters/fflate.js is npm's fflate 0.8.3 umd/index.js as published (`npm pack fflate@0.8.3`), and
    nothing in it can end the <script> element it is inlined in."""
    import hashlib

    from support import REPO

    text = (REPO / "exporters" / "fflate.js").read_bytes()
    assert hashlib.sha256(text).hexdigest() == "462ef8041fc970e3615a20a9dd2b2e3047a073b2da729ef4f02b634bba8b7b83"
    assert b"</" not in text and b"<!--" not in text
    assert (REPO / "exporters" / "fflate.LICENSE").read_text().startswith("MIT License")


def test_header_shows_stack_quality_when_the_record_has_it(record: Record, tmp_path: Path) -> None:
    """Records of recorders that count complete user stacks (RecordMeta.stack_quality, issue 10) show it;
    older records show how user stacks were taken, and no line when they have neither."""
    import io

    from optrace.exporters.flamegraph import header_facts
    from optrace.exporters.formats import PROFILE
    from optrace.frontend.report.rows import Profile, ReportOptions

    assert "Stacks" not in dict(header_facts(record, "r"))
    record.meta.user_stacks = {"raw": 90, "build_id": 10}
    assert dict(header_facts(record, "r"))["Stacks"] == "user stacks: build_id 10, raw 90"
    record.meta.stack_quality = {"complete": 970, "no_cfi": 20, "read_fault": 10}
    record.meta.call_graph = "dwarf"
    expected = "97.0% of 1000 user stacks complete (stopped: no_cfi 20, read_fault 10), unwound by dwarf"
    assert dict(header_facts(record, "r"))["Stacks"] == expected
    out = io.StringIO()
    PROFILE.writer("flamegraph")(out, Profile(record, "r"), ReportOptions())
    assert f"<dt>Stacks</dt><dd>{expected}</dd>" in out.getvalue()


INTERACT = """<script>
// test driver, appended to a copy of the page: hover, click, reset, and write what the page showed
(function () {
  const canvas = document.getElementById("canvas"), tip = document.getElementById("tip");
  const r = canvas.getBoundingClientRect(), row = (depth) => r.top + depth * 18 + 9;
  function hover(x, depth) {
    canvas.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + x, clientY: row(depth), bubbles: true}));
    return tip.hidden ? "" : tip.textContent.split("\\n")[0] + " | " + tip.textContent.split("\\n").slice(-1)[0];
  }
  const out = {};
  out.before = hover(r.width / 2, 3);
  out.hotA = hover(5, 3);
  canvas.dispatchEvent(new MouseEvent("click", {clientX: r.left + 5, clientY: row(3), bubbles: true}));
  out.zoomed = hover(r.width / 2, 3);
  out.above = hover(r.width * 0.95, 2);
  document.getElementById("reset").click();
  out.reset = hover(r.width / 2, 3);
  document.body.dataset.result = JSON.stringify(out);
})();
</script></body>"""


def test_hover_click_to_zoom_and_reset(optrace, record_file: Path, tmp_path: Path) -> None:
    """The page's tooltip, zoom and reset, driven by mouse events in Chromium: in the synthetic record
    row 3 holds demo's callees of main, hot_a (40%) at the left and hot_b (20%) in the middle."""
    import html
    import json

    out = tmp_path / "flame.html"
    optrace("report", "-i", str(record_file), "-f", "flamegraph", "-o", str(out), check=True)
    driven = tmp_path / "driven.html"
    driven.write_text(out.read_text().replace("</body>", INTERACT))
    body = read_page(dump_dom(driven)).body
    result = json.loads(html.unescape(body["data-result"]))
    assert result["before"] == "hot_b | user frame, 200 samples, 20.00% of all; self 200 (20.00%)"
    assert result["hotA"] == "hot_a | user frame, 400 samples, 40.00% of all; self 400 (40.00%)"
    assert result["zoomed"].startswith("hot_a | ")  # hot_a now spans the width
    assert result["above"].startswith("main | ")  # its callers stay drawn above it, full width
    assert result["reset"].startswith("hot_b | ")


def test_search_lists_the_matching_functions_with_their_share(optrace, record_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "flame.html"
    optrace("report", "-i", str(record_file), "-f", "flamegraph", "-o", str(out), check=True)
    page = read_page(dump_dom(out, "#search=hot_"))
    assert page.matches == [["40.00%", "400", "hot_a", "/work/main/workloads/build/demo"],
                            ["20.00%", "200", "hot_b", "/work/main/workloads/build/demo"],
                            ["5.00%", "50", "hot_a", "/usr/bin/bash"]]
    assert "matches" not in page.hidden
    idle = read_page(dump_dom(out))
    assert idle.matches == [] and "matches" in idle.hidden


FLIP = """<script>
// test driver: hover a row at the left edge, flip the order in place, hover again, flip back
(function () {
  const canvas = document.getElementById("canvas"), tip = document.getElementById("tip");
  const flip = document.getElementById("flip"), r = canvas.getBoundingClientRect();
  function hover(depth) {
    canvas.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + 5, clientY: r.top + depth * 18 + 9, bubbles: true}));
    return tip.hidden ? "" : tip.textContent.split("\\n")[0] + " | " + tip.textContent.split("\\n").slice(-1)[0];
  }
  const out = {caller: [hover(2), hover(3)], button: flip.textContent};
  flip.click();
  out.callee = [hover(2), hover(3), document.body.dataset.order, flip.textContent];
  flip.click();
  out.back = [hover(2), document.body.dataset.order];
  document.body.dataset.result = JSON.stringify(out);
})();
</script></body>"""


def test_flip_between_caller_and_callee_order_in_place(optrace, record_file: Path, tmp_path: Path) -> None:
    """The synthetic record's demo: main calls hot_a (40%), hot_b, lib_burn and write; flipped, hot_a heads
    its own tower with main above it, the hottest functions unchanged."""
    import html
    import json

    out, driven = tmp_path / "flame.html", tmp_path / "driven.html"
    optrace("report", "-i", str(record_file), "-f", "flamegraph", "-o", str(out), check=True)
    driven.write_text(out.read_text().replace("</body>", FLIP))
    page = read_page(dump_dom(driven))
    result = json.loads(html.unescape(page.body["data-result"]))
    assert result["caller"] == ["main | user frame, 900 samples, 90.00% of all; self 0 (0.00%)",
                                "hot_a | user frame, 400 samples, 40.00% of all; self 400 (40.00%)"]
    assert result["button"] == "Flip to callee order"
    assert result["callee"] == ["hot_a | user frame, 400 samples, 40.00% of all; self 0 (0.00%)",
                                "main | user frame, 400 samples, 40.00% of all; self 400 (40.00%)",
                                "callee", "Flip to caller order"]
    assert result["back"] == ["main | user frame, 900 samples, 90.00% of all; self 0 (0.00%)", "caller"]
    assert share(page, "hot_a") == 40.0 and share(page, "main") == 90.0
    callee = read_page(dump_dom(out, "#order=callee&search=main"))
    assert callee.body["data-order"] == "callee" and callee.match == "Matched: 950 samples, 95.00% of all"


THIN = """<script>
// test driver: the colour drawn where the 1-sample frame thin_t sits (depth 3, at half the width)
(function () {
  const canvas = document.getElementById("canvas"), ratio = window.devicePixelRatio || 1;
  const x = Math.round((canvas.width / ratio) * 49999 / 99999) + 1, y = 3 * 18 + 9;
  const pixel = canvas.getContext("2d").getImageData(x * ratio, y * ratio, 1, 1).data;
  document.body.dataset.result = Array.from(pixel.slice(0, 3)).join(",");
})();
</script></body>"""


def test_a_match_too_thin_to_draw_is_still_marked(optrace, record: Record, tmp_path: Path) -> None:
    """One sample in 99,999: thin_t is 0.01 px wide, under the width frames are drawn at; searched for, it
    is marked 3 px wide in the search colour, and listed."""
    frames = [Frame("wide_a", "/x"), Frame("wide_a1", "/x"), Frame("thin_t", "/x"), Frame("wide_b", "/x")]
    samples = [Sample(1, "c", (1, 0), 49_999), Sample(1, "c", (2, 0), 1), Sample(1, "c", (3,), 49_999)]
    data, out, driven = tmp_path / "thin.data", tmp_path / "thin.html", tmp_path / "driven.html"
    write_record(Record(meta=record.meta, frames=frames, samples=samples), data)
    optrace("report", "-i", str(data), "-f", "flamegraph", "-o", str(out), check=True)
    driven.write_text(out.read_text().replace("</body>", THIN))
    assert read_page(dump_dom(driven)).body["data-result"] != "224,64,251"
    page = read_page(dump_dom(driven, "#search=thin_t"))
    assert page.body["data-result"] == "224,64,251"  # #e040fb
    assert page.matches == [["0.00%", "1", "thin_t", "/x"]]


SVG_DRIVER = """<script><![CDATA[
// test driver: zoom on hot_a (a click on its frame), then write what is shown
(function () {
  var frames = Array.prototype.slice.call(document.querySelectorAll("g[data-samples]"));
  var hot = frames.filter(function (g) { return g.querySelector("title").textContent.indexOf("hot_a in /work") === 0; })[0];
  hot.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  var shown = frames.filter(function (g) { return g.style.display !== "none"; }).map(function (g) {
    var rect = g.querySelector("rect"), text = g.querySelector("text");
    return [g.querySelector("title").textContent.split(":")[0], +rect.getAttribute("x"), +rect.getAttribute("width"),
            text ? text.textContent : ""];
  });
  document.documentElement.setAttribute("data-result", JSON.stringify(shown));
})();
]]></script></svg>"""


def test_svg_zooms_and_searches_by_itself(optrace, record_file: Path, tmp_path: Path) -> None:
    """In Chromium, the SVG file alone: #search= colours the matches and says their share; a click on hot_a
    zooms on it (full width, its callers above it), the rest hidden."""
    import html
    import json

    out, driven = tmp_path / "flame.svg", tmp_path / "driven.svg"
    optrace("report", "-i", str(record_file), "-f", "svg", "-o", str(out), check=True)
    root = ET.parse(out).getroot()
    assert len(root.findall(SVG + "script")) == 1 and "]]>" not in root.find(SVG + "script").text
    dom = dump_dom(out, "#search=hot_")
    assert re.search(r'<text id="matched"[^>]*>Matched: 65\.00% of all</text>', dom)
    coloured = re.findall(r'<title>([^<:]+)[^<]*</title><rect[^>]*fill="#e040fb"', dom)
    assert sorted(coloured) == ["hot_a in /usr/bin/bash", "hot_a in /work/main/workloads/build/demo",
                                "hot_b in /work/main/workloads/build/demo"]
    driven.write_text(out.read_text().replace("</svg>", SVG_DRIVER))
    shown = json.loads(html.unescape(re.search(r'data-result="([^"]*)"', dump_dom(driven)).group(1)))
    assert [name for name, *_ in shown] == ["all (1000 samples)", "demo", "main in /work/main/workloads/build/demo",
                                            "hot_a in /work/main/workloads/build/demo"]
    assert all((x, width) == (0, 1200) for _, x, width, _ in shown)
    assert shown[-1][3] == "hot_a" and re.search(r'data-zoomed="hot_a"', dump_dom(driven))
