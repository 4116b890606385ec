"""Views in Python's terms on real recordings (issue 41): a pure-Python job on Debian's stripped python3.11 has its
self time on its Python functions, not on the interpreter's own code (55-60 % before), within a few points of
the job's own account of each function's CPU time; `annotate` of a function whose time is all in its callees
shows its lines with the samples under each (a made job whose shares are known, and Django 5.2's
``Template.render``, which answered "no annotatable function ... did you mean ForNode.render?")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pythons import DEBIAN_311, PROGRAMS
from support import REPO, first_in_line, run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")

CALLEES = PROGRAMS / "callees.py"
DJANGO = PROGRAMS / "djangorender.py"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"  # Debian's python3.11 with the test dependencies (Django)
POINTS = 5.0
MIN_INTERNALS = 30.0  # the interpreter's share of the job's self time as recorded: below it, the case proves nothing


def report_json(path: Path, *args: str) -> dict:
    return json.loads(run_optrace("report", "-i", str(path), "--format", "json", *args, check=True).stdout)


def annotate_json(path: Path, symbol: str) -> dict:
    return json.loads(run_optrace("annotate", "-i", str(path), symbol, "-f", "json", check=True).stdout)


@pytest.fixture(scope="module")
def callees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """callees.py recorded whole on Debian's python3.11, and its own account of its functions' CPU seconds."""
    if not DEBIAN_311.exists():
        pytest.skip("Debian's python3.11 is not installed")
    out = tmp_path_factory.mktemp("callees") / "callees.data"
    proc = run_optrace("record", "-F", "999", "-o", str(out), "--", str(DEBIAN_311), str(CALLEES), "1.5", check=True,
                       timeout=300, preexec_fn=first_in_line)  # 1.5 s of CPU: ~1,500 samples however busy the machine
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


def share(part: float, parts: list[float]) -> float:
    return 100.0 * part / sum(parts) if sum(parts) else 0.0


def test_self_rows_of_a_pure_python_job_are_its_python_functions(callees) -> None:
    record, spent = callees
    by_dso = {row["dso"]: row["percent"] for row in report_json(record, "--sort", "dso")["rows"]}
    recorded = {row["dso"]: row["percent"] for row in report_json(record, "--sort", "dso", "--python-internals")["rows"]}
    assert recorded[str(DEBIAN_311)] >= MIN_INTERNALS, f"the interpreter's code had too little to fold: {recorded}"
    assert by_dso.get(str(DEBIAN_311), 0.0) <= 10.0, by_dso
    rows = {row["symbol"]: row["samples"] for row in report_json(record, "--sort", "symbol")["rows"]}
    measured = share(spent["parse"], [spent["parse"], spent["split_words"]])
    assert abs(share(rows["parse"], [rows["parse"], rows["split_words"]]) - measured) <= POINTS, (rows, spent)


def test_annotate_shows_a_callers_lines_by_the_samples_under_them(callees) -> None:
    """render does nothing itself: its lines' shares are those of the callees each calls, as they measured them."""
    record, spent = callees
    doc = annotate_json(record, "render")
    lines = {row["text"].split("# calls: ")[1]: row for row in doc["lines"] if "# calls: " in row["text"]}
    measured = share(spent["parse"], [spent["parse"], spent["split_words"]])
    assert abs(lines["parse"]["percent"] - measured) <= POINTS, (doc, spent)
    split = lines["split_words, first"]["percent"] + lines["split_words, second"]["percent"]
    assert abs(split - (100 - measured)) <= POINTS, (doc, spent)
    assert doc["function"]["self_samples"] <= 0.02 * doc["function"]["samples"], doc["function"]
    children = {row["symbol"]: row["children"]
                for row in report_json(record, "--sort", "symbol", "--children")["rows"]}
    assert doc["function"]["samples"] == children["render"]


@pytest.fixture(scope="module")
def django_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("django") / "django.data"
    run_optrace("record", "-F", "999", "-o", str(out), "--", str(VENV_PYTHON), str(DJANGO), "4", check=True,
                timeout=300, preexec_fn=first_in_line)
    return out


def test_djangos_template_render_is_annotated_from_its_callees(django_record: Path) -> None:
    import django.template.base

    doc = annotate_json(django_record, "Template.render")
    source = Path(django.template.base.__file__).read_text().splitlines()
    assert doc["function"]["file"] == django.template.base.__file__
    for row in doc["lines"]:
        assert row["text"] == source[row["line"] - 1]
    children = {row["symbol"]: row["children"]
                for row in report_json(django_record, "--sort", "symbol", "--children")["rows"]}
    assert doc["function"]["samples"] == children["Template.render"] >= 0.4 * children["main"], children
    hottest = max(doc["lines"], key=lambda row: row["samples"])
    assert hottest["text"].strip() == "return self._render(context)" and hottest["percent"] >= 90, hottest
    view = annotate_json(django_record, "html_view")
    assert view["lines"][-1]["text"].strip().startswith("return PAGE.render(") and view["lines"][-1]["percent"] >= 90
