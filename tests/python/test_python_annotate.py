"""`optrace annotate` of Python functions: the record keeps the hottest functions' source lines with the samples
of each (the innermost Python frame's line), so annotate needs neither the process nor the file."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from optrace.credentials import Credentials, run_as
from optrace.frontend.runtimes.cpython import sourcecapture
from optrace.frontend.runtimes.cpython.sourcecapture import (SourceOwner, capture_sources, function_end,
                                                             read_sources, source_owner)
from optrace.model import Frame, RuntimeSource, Record, RecordMeta, Sample
from optrace.procfs import comm
from optrace.recordfile import write_record
from pythons import PROGRAMS, require
from support import assert_one_line_error, run_optrace, running

MIXED = PROGRAMS / "mixed.py"


@pytest.mark.usefixtures("bpf_ready")
def test_annotate_shows_a_python_functions_lines_with_their_share(tmp_path) -> None:
    data = tmp_path / "py.data"
    run_optrace("record", "-F", "499", "-o", str(data), "--", str(require("3.12")), str(MIXED), "2", check=True,
                timeout=300)
    moved = tmp_path / "elsewhere.data"
    os.rename(data, moved)  # the record alone
    doc = json.loads(run_optrace("annotate", "-i", str(moved), "rank", "-f", "json", check=True).stdout)
    source = MIXED.read_text().splitlines()
    assert doc["function"]["file"] == str(MIXED) and doc["function"]["samples"] >= 20  # 34 at load 30
    for row in doc["lines"]:
        assert row["text"] == source[row["line"] - 1]
    hottest = max(doc["lines"], key=lambda row: row["samples"])
    assert hottest["text"].endswith("# hot: rank") and hottest["percent"] >= 50, hottest
    assert doc["lines"][-1]["text"].strip() == "return score"  # the function's lines, not the next one's
    listed = run_optrace("annotate", "-i", str(moved), check=True).stdout
    assert "mixed.py" in listed and " rank" in listed
    text = run_optrace("annotate", "-i", str(moved), "rank", check=True).stdout
    assert "Source of rank in" in text and "# hot: rank" in text


def test_a_functions_lines_end_where_its_body_does() -> None:
    text = ["@cache", "@other(", "  1)", "def f(a,", "      b", "):", "    x = 1", "", "    # note", "    return x",
            "", "def g():", "    pass", "class C:", "    def m(self):", "        return 1", "    def n(self):"]
    assert function_end(text, 1) == 10
    assert function_end(text, 12) == 13
    assert function_end(text, 15) == 16
    assert function_end(text, 17) == 17


@contextmanager
def process_of(uid: int, gid: int, *groups: int) -> Iterator[int]:
    """A sleeping process of ``uid``/``gid`` with these supplementary groups (no capabilities): its pid."""
    group_option = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    with running(["setpriv", f"--reuid={uid}", f"--regid={gid}", *group_option, "sleep", "60"]) as proc:
        deadline = time.monotonic() + 10
        while comm(proc.pid) != "sleep":  # setpriv holds its capabilities as the user until it execs
            assert time.monotonic() < deadline, "setpriv never ran sleep"
            time.sleep(0.01)
        assert source_owner(proc.pid).credentials == Credentials(uid, gid, tuple(sorted(groups)))
        yield proc.pid


def owned(path: Path, uid: int, gid: int, mode: int) -> Path:
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return path


def written(path: Path, text: str, uid: int, gid: int, mode: int) -> Path:
    path.write_text(text)
    return owned(path, uid, gid, mode)


@pytest.fixture
def tree() -> Iterator[Path]:
    """Folders of root's, the process user's (USER) and a third user's (THIRD), each 0700 with a 0644 file,
    and the user's own 0600 file, under a folder anyone may pass through (pytest's are root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="optrace-sources-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    for name, uid in (("root", 0), ("user", USER), ("third", THIRD)):
        (base / name).mkdir()
        owned(base / name, uid, uid, 0o700)
        written(base / name / "open.py", f"x = '{name}'\n", uid, uid, 0o644)
    written(base / "user" / "own.py", "x = 'own'\n", USER, USER, 0o600)
    yield base
    shutil.rmtree(base)


USER, THIRD, GROUP = 64001, 64002, 64003  # no account needed: the kernel checks numbers


@pytest.mark.skipif(os.geteuid() != 0, reason="takes other users' credentials")
def test_a_source_is_read_only_if_the_processes_user_can_open_it_along_the_whole_path(tree: Path) -> None:
    """Issue 40: a 0644 file in root's 0700 folder, or in a third user's, is not read for a process of
    USER (the file's mode bits alone said it was); through a symlinked folder neither; its own 0600 file is."""
    (tree / "user" / "link").symlink_to(tree / "user")
    with process_of(USER, USER) as pid:
        names = [str(tree / "root" / "open.py"), str(tree / "third" / "open.py"), str(tree / "user" / "own.py"),
                 str(tree / "user" / "link" / "own.py"), "relative.py"]
        assert read_one(pid, names, source_owner(pid)) == {str(tree / "user" / "own.py"): ["x = 'own'"]}


@pytest.mark.skipif(os.geteuid() != 0, reason="takes other users' credentials")
def test_a_source_is_read_with_the_processes_groups_and_capabilities(tree: Path) -> None:
    """The kernel decides: a 0640 file of a group the process is in (mode bits of the owner and others
    alone said no), and any file for a root process (``sudo python ~/script.py``: its user's 0700 home)."""
    (tree / "shared").mkdir()
    shared = owned(tree / "shared", 0, GROUP, 0o750)
    written(shared / "group.py", "x = 'group'\n", 0, GROUP, 0o640)
    with process_of(USER, USER, GROUP) as pid:
        assert read_one(pid, [str(shared / "group.py")], source_owner(pid)) == {str(shared / "group.py"): ["x = 'group'"]}
    with process_of(USER, USER) as pid:
        assert read_one(pid, [str(shared / "group.py")], source_owner(pid)) == {}
    here = source_owner(os.getpid())
    assert read_one(os.getpid(), [str(tree / "user" / "own.py")], here) == {str(tree / "user" / "own.py"): ["x = 'own'"]}


@pytest.mark.skipif(os.geteuid() != 0, reason="takes other users' credentials")
def test_a_gone_processes_sources_are_read_with_the_credentials_it_had(tree: Path) -> None:
    """Gone (or its pid used again): the credentials it was first seen with, in optrace's root if it was
    its own; a process of another mount namespace's paths are not read once it is gone."""
    with process_of(USER, USER) as pid:
        owner = source_owner(pid)
    names = [str(tree / "user" / "own.py"), str(tree / "third" / "open.py")]
    assert read_one(pid, names, owner) == {names[0]: ["x = 'own'"]}
    assert read_one(os.getpid(), names, owner) == {names[0]: ["x = 'own'"]}  # a pid now another's
    assert read_one(pid, names, dataclasses.replace(owner, host_mounts=False)) == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="takes other users' credentials")
def test_processes_with_the_same_credentials_are_read_in_one_batch(tree: Path, monkeypatch) -> None:
    taken = []
    monkeypatch.setattr(sourcecapture, "run_as", lambda user, work, seconds: taken.append(user) or run_as(user, work, seconds))
    own, third = str(tree / "user" / "own.py"), str(tree / "third" / "open.py")
    with process_of(USER, USER) as first, process_of(USER, USER) as second, process_of(THIRD, THIRD) as other:
        owners = {pid: source_owner(pid) for pid in (first, second, other)}
        found = read_sources({first: [own], second: [own, third], other: [own, third]}, owners)
    assert found == {(first, own): ["x = 'own'"], (second, own): ["x = 'own'"], (other, third): ["x = 'third'"]}
    assert sorted(user.uid for user in taken) == [USER, THIRD]


def read_one(pid: int, files: list[str], owner: SourceOwner) -> dict[str, list[str]]:
    return {file: lines for (_, file), lines in read_sources({pid: files}, {pid: owner}).items()}


def test_a_hostile_records_python_source_is_skipped_with_a_warning(tmp_path) -> None:
    meta = RecordMeta("0", "h", "k", 0.0, 1.0, 99, "cpu-clock")
    bad = RuntimeSource("f", "/x.py", 10, ["def f():", "  pass"], {10: 1, 99: 5}, 1)
    record = Record(meta, [Frame("f", "/x.py", kind="cpython", line=10, address=10)], [Sample(1, "p", (0,), 6)],
                    functions=[], sources=[bad])
    out = tmp_path / "bad.data"
    write_record(record, out)
    proc = run_optrace("annotate", "-i", str(out))
    assert proc.returncode == 0 and "skipped: sample lines outside its source" in proc.stderr
    assert_one_line_error(run_optrace("annotate", "-i", str(out), "f"), "cannot be annotated")


def python_frame(symbol: str, first: int, line: int, file: str = "/app/views.py") -> Frame:
    return Frame(symbol, file, address=first, kind="cpython", line=line)


VIEWS = ["def render_page(rows):", "    return rows", "", "", "def html_view(request):", "    page = render_page(1)",
         "    page += render_page(2)", "    return page", "", "", "def html_view_impl():", "    pass"]


def views_record() -> Record:
    """pid 1's html_view has no time of its own: its two lines call render_page (3:1 by samples), once recursively
    (a sample holding html_view on both lines counts once for it, once for each line); pid 2 is another program
    with a function named like it."""
    frames = [python_frame("render_page", 1, 2), python_frame("html_view", 5, 6), python_frame("html_view", 5, 7),
              python_frame("html_views", 1, 2, "/other/app.py"), python_frame("html_view_impl", 11, 12)]
    samples = [Sample(1, "python3", (0, 1), 60), Sample(1, "python3", (0, 2), 20), Sample(1, "python3", (0, 2, 1), 10),
               Sample(1, "python3", (4,), 10), Sample(2, "other", (3,), 100)]
    sources = [RuntimeSource("render_page", "/app/views.py", 1, VIEWS[:2], {2: 90}, 1),
               RuntimeSource("html_view", "/app/views.py", 5, VIEWS[4:8], {}, 1),
               RuntimeSource("html_view_impl", "/app/views.py", 11, VIEWS[10:], {12: 10}, 1),
               RuntimeSource("html_views", "/other/app.py", 1, ["def html_views():", "    pass"], {2: 100}, 2)]
    return Record(RecordMeta("0", "h", "k", 0.0, 1.0, 99, "cpu-clock"), frames, samples, functions=[],
                  sources=sources)


def test_a_callers_lines_count_the_samples_under_them(tmp_path) -> None:
    out = tmp_path / "views.data"
    write_record(views_record(), out)
    doc = json.loads(run_optrace("annotate", "-i", str(out), "html_view", "-f", "json", check=True).stdout)
    assert doc["function"]["samples"] == 90 and doc["function"]["self_samples"] == 0
    shares = {row["line"]: (row["samples"], row["self_samples"]) for row in doc["lines"]}
    assert shares == {5: (0, 0), 6: (70, 0), 7: (30, 0), 8: (0, 0)}
    text = run_optrace("annotate", "-i", str(out), "html_view", check=True).stdout
    assert "   77.78          :        6      page = render_page(1)" in text, text
    leaf = json.loads(run_optrace("annotate", "-i", str(out), "render_page", "-f", "json", check=True).stdout)
    assert [(row["samples"], row["self_samples"]) for row in leaf["lines"]] == [(0, 0), (90, 90)]


def test_suggestions_come_from_the_process_that_holds_the_symbol(tmp_path) -> None:
    """In a record of the whole machine, `annotate render` names what render's own process kept."""
    record = views_record()
    record.sources = [s for s in record.sources if s.symbol != "html_view"]
    out = tmp_path / "views.data"
    write_record(record, out)
    proc = run_optrace("annotate", "-i", str(out), "html_view")
    assert_one_line_error(proc, "no annotatable function html_view in the record; it is in 90 samples' stacks "
                                "(pid 1), but record kept neither its code nor its source",
                          "did you mean html_view_impl (same process)?")
    assert "html_views" not in proc.stderr
    assert_one_line_error(run_optrace("annotate", "-i", str(out), "html_viewz"), "did you mean html_views")


def test_record_keeps_the_source_of_functions_whose_time_is_in_their_callees() -> None:
    record = views_record()
    kept = capture_sources(record.frames, record.samples,
                           lambda wanted: {(pid, "/app/views.py"): VIEWS for pid, files in wanted.items()
                                           if "/app/views.py" in files})
    assert [(s.symbol, s.first_line, s.hits) for s in kept] == [
        ("render_page", 1, {2: 90}), ("html_view_impl", 11, {12: 10}), ("html_view", 5, {})]
    assert kept[-1].text == VIEWS[4:8]
