"""The README is a front page that does not drift: every marked example in it and in docs/ is a real run (see
readmecheck.py for how to mark one), every optrace command and option it shows exists in the CLI, every
docs page is linked from it, and it stays short."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import readmecheck
from support import REPO

README = (REPO / "README.md").read_text()
PAGES = sorted((REPO / "docs").glob("*.md"))
BLOCKS = [(path, block) for path in [REPO / "README.md", *PAGES]
          for block in readmecheck.checked_blocks(path.read_text())]
MAX_README_LINES = 300
PYTHON_MARKER = "<!-- python-example -->"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _synthetic_record():
    """The report tests' record of known counts (tests/report/conftest.py)."""
    spec = importlib.util.spec_from_file_location("report_conftest", REPO / "tests" / "report" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic_record(with_calls=True)


def _workdir(tmp_path: Path, real: Path | None) -> Path:
    from optrace.recordfile import write_record

    (tmp_path / "workloads").symlink_to(REPO / "workloads")
    write_record(_synthetic_record(), tmp_path / "optrace.data")
    if real is not None:
        (tmp_path / "real.data").write_bytes(real.read_bytes())
    return tmp_path


def test_blocks_are_found():
    assert len(BLOCKS) >= 5 and {block.mode for _, block in BLOCKS} == {"exact", "shape"}


@pytest.mark.parametrize("path,block", [
    pytest.param(path, block, id=f"{path.relative_to(REPO)}:{block.line}",
                 marks=[pytest.mark.bpf] if block.needs_recording else [])
    for path, block in BLOCKS])
def test_readme_example(request, tmp_path, path, block):
    real = None
    if block.needs_recording:
        request.getfixturevalue("bpf_ready")
        real = request.getfixturevalue("demo_record")
    workdir = _workdir(tmp_path, real)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for example in block.examples:
        command, as_nobody = readmecheck.shell_command(example.command)
        argv = [*(NOBODY if as_nobody else []), "sh", "-c", command]
        proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
        stdout = readmecheck.normalize(proc.stdout, REPO, workdir)
        stderr = readmecheck.normalize(proc.stderr, REPO, workdir)
        problem = readmecheck.mismatch(block.mode, example.expected, stdout, stderr)
        assert problem is None, f"{path.relative_to(REPO)}:{block.line} `$ {example.command}`: {problem}"


def test_the_checker_fails_on_drift_and_passes_new_figures():
    """shape: numbers may change, names may not; exact: every line, nothing more."""
    expected = ("# Samples: 1010 of event 'cpu-clock', 499 Hz, 3.10 s", "    38.02%      384  demo  [.] hot_a")
    real = ["# Samples: 2012 of event 'cpu-clock', 999 Hz, 2.00 s", "  40.1%   807  demo  [.] hot_a", "extra"]
    assert readmecheck.mismatch("shape", expected, real, []) is None
    assert readmecheck.mismatch("shape", expected, [real[0].replace("event", "evnt"), real[1]], [])
    assert readmecheck.mismatch("shape", expected, [real[0]], [])  # a row gone
    assert readmecheck.mismatch("exact", ("a", "b"), ["a"], ["b"]) is None  # stdout and stderr interleave
    assert readmecheck.mismatch("exact", ("a",), ["a"], ["b"])  # a line more
    assert readmecheck.mismatch("exact", ('"lost": {"map full": 0}',), ['"lost": {}'], [])


def test_markers_and_commands_are_read_as_documented():
    text = "x\n<!-- checked: shape -->\n```\n$ sudo optrace doctor   # not root\nok\n\n$ optrace report\n```\n" \
           "```\n$ unmarked\n```\n"
    [block] = readmecheck.checked_blocks(text)
    assert block.mode == "shape" and [e.command for e in block.examples] == ["sudo optrace doctor   # not root",
                                                                             "optrace report"]
    assert block.examples[0].expected == ("ok", "")
    assert readmecheck.shell_command(block.examples[0].command) == ("optrace doctor", True)
    assert readmecheck.shell_command("optrace report -i x  # the demo") == ("optrace report -i x", False)


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= MAX_README_LINES, "the README is a front page: put the reference in docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)(?:#[^)]*)?\)", README))
    assert PAGES and {f"docs/{page.name}" for page in PAGES} <= linked
    assert all((REPO / link).is_file() for link in linked), linked


@pytest.mark.parametrize("path", [REPO / "README.md", *PAGES], ids=lambda path: str(path.relative_to(REPO)))
def test_every_optrace_command_shown_exists_in_the_cli(path):
    from optrace.frontend.cli import cli

    shown = readmecheck.invocations(path.read_text())
    problems = [f"`{line}`: {problem}" for line, arguments in shown
                if (problem := readmecheck.cli_problem(cli, arguments))]
    assert problems == []
    if path.name == "README.md":  # one example per command at least
        assert {arguments[0] for _, arguments in shown} >= {"record", "report", "top", "annotate", "diff", "count",
                                                            "serve", "jit", "doctor"}


def test_the_cli_check_sees_what_the_cli_lacks():
    from optrace.frontend.cli import cli

    text = "```\n$ sudo optrace report --no-such-option -i x.data\n$ optrace jit shw f\n```\n" \
           "Also `optrace top --stdio -p $(pgrep -n demo) -n 2 | head` and `optrace record -F 99 -- ./app --weird`.\n"
    shown = readmecheck.invocations(text)
    assert [arguments for _, arguments in shown] == [["report", "--no-such-option", "-i", "x.data"], ["jit", "shw", "f"],
                                                    ["top", "--stdio", "-p", "1", "-n", "2"],
                                                    ["record", "-F", "99", "--", "./app", "--weird"]]
    assert [readmecheck.cli_problem(cli, arguments) for _, arguments in shown] == [
        "optrace report has no option --no-such-option", "no command 'shw' in optrace jit", None, None]


def test_python_comes_first_with_its_checked_example():
    sections = re.findall(r"^## (.+)$", README, re.M)
    assert sections.index("Python") < sections.index("One example per command")
    start, end = (match.start() for match in re.finditer(re.escape(PYTHON_MARKER), README))
    example = README[start:end]
    assert "<!-- checked: shape -->" in example and "optrace record" in example and "python3" in example
    assert "optrace report" in example and "[.] rank" in example


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", [REPO / "README.md", *PAGES], ids=lambda path: str(path.relative_to(REPO)))
def test_every_link_between_the_pages_arrives(path):
    broken = []
    for target, fragment in re.findall(r"\]\((?!https?:)([^)#\s]*)(?:#([^)\s]+))?\)", path.read_text()):
        page = (path.parent / target).resolve() if target else path
        if not page.exists():
            broken.append(target)
        elif fragment and page.suffix == ".md" and fragment not in {
                anchor(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}:
            broken.append(f"{target}#{fragment}")
    assert broken == []
