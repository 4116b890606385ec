"""`optrace annotate` on records built in code: the layout, the shares, JSON, and bad input (an old record,
an unknown symbol, hostile code blobs and offsets). No BPF, no root."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from optrace.model import Frame, FunctionCode, Record, RecordMeta, Sample, SourceLine
from optrace.recordfile import write_record
from support import OPTRACE, assert_one_line_error, run_optrace

# mov %rdi,%rax; 1: dec %rax; jne 1b; ret   (jitcode's loop)
LOOP = bytes([0x48, 0x89, 0xF8, 0x48, 0xFF, 0xC8, 0x75, 0xFB, 0xC3])
BIN = "/opt/app/bin/server"


def meta() -> RecordMeta:
    return RecordMeta(optrace_version="0.1.0", hostname="h", kernel="6.18", started=1.8e9, duration_s=1.0,
                      frequency_hz=99, event="cpu-clock", total_samples=1000)


def make_record(functions: list[FunctionCode] | None) -> Record:
    frames = [Frame("spin", BIN, address=0x1003, build_id="ab" * 20), Frame("main", BIN, address=0x900)]
    samples = [Sample(7, "server", (0, 1), 900), Sample(7, "server", (1,), 100)]
    return Record(meta=meta(), frames=frames, samples=samples, functions=functions)


def spin(**changes) -> FunctionCode:
    fields = dict(symbol="spin", dso=BIN, start=0x401000, code=LOOP, hits={3: 450, 6: 400, 0: 50},
                  build_id="ab" * 20, pid=7)
    fields.update(changes)
    return FunctionCode(**fields)


def written(tmp_path: Path, functions: list[FunctionCode] | None, name: str = "r.data") -> str:
    path = tmp_path / name
    write_record(make_record(functions), path)
    return str(path)


def test_perf_style_lines_sum_to_100(tmp_path):
    out = run_optrace("annotate", "-i", written(tmp_path, [spin()]), "spin", check=True).stdout
    lines = [line for line in out.splitlines() if line[:9].strip() and ":" in line and not line.startswith(" Percent")]
    shares = {line.split(":")[1].strip(): float(line.split(":")[0]) for line in lines}
    assert shares == {"401000": 5.56, "401003": 50.0, "401006": 44.44}
    assert "401003:   decq   %rax" in out and "401006:   jne    0x401003" in out
    assert "\x1b[" not in out  # not a terminal: no colour


def test_json_and_intel(tmp_path):
    out = run_optrace("annotate", "-i", written(tmp_path, [spin()]), "spin", "-M", "intel", "-f", "json",
                      check=True).stdout
    doc = json.loads(out)
    assert doc["function"]["samples"] == 900
    assert sum(i["percent"] for i in doc["instructions"]) == pytest.approx(100, abs=0.01)
    assert [i["text"] for i in doc["instructions"]][:2] == ["mov    rax, rdi", "dec    rax"]


def test_processes_merge_and_pid_selects(tmp_path):
    other = spin(pid=8, hits={0: 100})
    path = written(tmp_path, [spin(), other])
    both = json.loads(run_optrace("annotate", "-i", path, "spin", "-f", "json", check=True).stdout)
    assert both["function"]["samples"] == 1000 and both["function"]["pids"] == [7, 8]
    one = json.loads(run_optrace("annotate", "-i", path, "spin", "-f", "json", "--pid", "8", check=True).stdout)
    assert one["function"]["samples"] == 100


def test_listing_without_symbol(tmp_path):
    out = run_optrace("annotate", "-i", written(tmp_path, [spin()]), check=True).stdout
    assert "900" in out and "90.00%" in out and re.search(r"server +spin", out)


def test_old_record_says_rerecord(tmp_path):
    assert_one_line_error(run_optrace("annotate", "-i", written(tmp_path, None), "spin"), "re-record")
    assert_one_line_error(run_optrace("annotate", "-i", written(tmp_path, None)), "re-record")


def test_unknown_symbol_suggests_close_names(tmp_path):
    assert_one_line_error(run_optrace("annotate", "-i", written(tmp_path, [spin()]), "spinn"),
                          "no annotatable function spinn", "did you mean spin")


@pytest.mark.parametrize("bad,problem", [
    (dict(hits={9: 1}), "offsets outside its code"),
    (dict(hits={2**40: 1}), "offsets outside its code"),
    (dict(code=b""), "0 bytes of code"),
    (dict(code=b"\x90" * (2 << 20), hits={0: 1}), "bytes of code"),
    (dict(arch="\x1b[2Jarm64"), "cannot be disassembled"),
    (dict(start=2**64 - 4), "past the address space"),
])
def test_hostile_function_is_skipped_in_one_line(tmp_path, bad, problem):
    path = written(tmp_path, [spin(**bad), spin(symbol="fine")])
    proc = run_optrace("annotate", "-i", path, "spin")
    assert_one_line_error(proc, "cannot be annotated", problem)
    assert "\x1b[2J" not in proc.stderr
    listing = run_optrace("annotate", "-i", path)
    assert listing.returncode == 0 and "fine" in listing.stdout and "Traceback" not in listing.stderr
    assert listing.stderr.count("\n") == 1 and "skipped" in listing.stderr


def test_names_with_escapes_are_escaped(tmp_path):
    path = written(tmp_path, [spin(symbol="evil\x1b]0;pwned\x07", dso="/x/\x1b[31mlib")])
    out = run_optrace("annotate", "-i", path, "evil\x1b]0;pwned\x07", check=True).stdout
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b]0;pwned\\x07" in out


def test_undecodable_bytes_still_sum_to_100(tmp_path):
    junk = b"\x0f\x0b\xff\xff\xff" + LOOP
    path = written(tmp_path, [spin(code=junk, hits={2: 10, 3: 10, 8: 80})])
    doc = json.loads(run_optrace("annotate", "-i", path, "spin", "-f", "json", check=True).stdout)
    assert sum(i["percent"] for i in doc["instructions"]) == pytest.approx(100, abs=0.01)


def test_source_lines_interleaved_and_summed(tmp_path):
    lines = [SourceLine(0, "/src/spin.c", 3), SourceLine(3, "/src/spin.c", 4), SourceLine(6, "/src/spin.c", 4)]
    path = written(tmp_path, [spin(lines=lines)])
    out = run_optrace("annotate", "-i", path, "spin", "-l", check=True).stdout
    assert "  94.44   /src/spin.c:4" in out and "   5.56   /src/spin.c:3" in out
    body = out[out.index("<spin>:"):].splitlines()[1:]
    assert [line.split(":   ", 1)[1] for line in body if "/src/" in line] == ["/src/spin.c:3", "/src/spin.c:4"]
    doc = json.loads(run_optrace("annotate", "-i", path, "spin", "-l", "-f", "json", check=True).stdout)
    assert [(line["source"], line["percent"]) for line in doc["function"]["lines"]] == [
        ("/src/spin.c:4", 94.4444), ("/src/spin.c:3", 5.5556)]
    bare = run_optrace("annotate", "-i", written(tmp_path, [spin()], "bare.data"), "spin", "-l", check=True).stdout
    assert "no source lines in the record" in bare


def test_source_lines_outside_the_code_are_refused(tmp_path):
    path = written(tmp_path, [spin(lines=[SourceLine(99, "/x.c", 1)])])
    assert_one_line_error(run_optrace("annotate", "-i", path, "spin", "-l"), "source lines outside its code")


def test_bad_options(tmp_path):
    path = written(tmp_path, [spin()])
    assert_one_line_error(run_optrace("annotate", "-i", path, "spin", "-M", "arm"), "-M takes att or intel")
    assert_one_line_error(run_optrace("annotate", "-i", path, "spin", "-f", "html"), "unknown format")
    assert_one_line_error(run_optrace("annotate", "-i", path, "spin", "--pid", "x"), "not a process id")


def test_hot_lines_coloured_on_a_terminal(tmp_path):
    """On a terminal (tmux pane, captured with its escapes) the hot line is red, like perf's."""
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed (scripts/setup-system.sh installs it)")
    path = written(tmp_path, [spin(hits={3: 990, 0: 10})])
    name = f"optrace-annotate-{os.getpid()}"
    command = f"{shlex.quote(str(OPTRACE))} annotate -i {shlex.quote(path)} spin; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "20", command], check=True)
    try:
        deadline = time.monotonic() + 60
        screen = ""
        while "retq" not in screen and time.monotonic() < deadline:
            time.sleep(0.2)
            screen = subprocess.run(["tmux", "capture-pane", "-e", "-p", "-t", name], capture_output=True,
                                    text=True, check=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], check=False)
    hot = next(line for line in screen.splitlines() if "decq" in line)
    cold = next(line for line in screen.splitlines() if "movq" in line)
    assert "\x1b[1;31m" in hot or "\x1b[31;1m" in hot or ("\x1b[1m" in hot and "31m" in hot), repr(hot)
    assert "31m" not in cold, repr(cold)
    assert "99.00" in hot
