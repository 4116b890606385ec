"""Issue 8's table, the file rows: root's optrace given files an unprivileged user made (no BPF).

Each command must end in time, under 1 GB, with either its normal output or a one-line error (exit 1,
never an internal error's 70), print no terminal control characters, and write no root-only file
through a planted symlink.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hostilefiles as hf
from hostilekit import HostileUser, Measured, Secret, assert_one_line, record_file_bytes, run_measured

QUICK_S = 10.0  # any of these commands on a file this small: well under that


def outcome_ok(run: Measured, max_wall_s: float = QUICK_S) -> None:
    """Normal output, or a one-line error with exit 1."""
    run.assert_sane(max_wall_s)
    assert run.returncode in (0, 1), run.describe()
    if run.returncode:
        assert_one_line(run.stderr, " ".join(run.argv[1:3]))


@pytest.fixture
def user_dir(hostile_user: HostileUser, tmp_path: Path) -> Path:
    """A fresh folder the user owns (in its home: root's pytest tmp dirs are root-only)."""
    folder = hostile_user.home / f"files-{secrets.token_hex(4)}"
    hostile_user.run("mkdir", folder)
    return folder


def test_report_tiny_lists_bomb(hostile_user, user_dir, tmp_path):
    """261 KB of zlib that inflates to 256 MiB of ``[[],[],...]``: refused before objects are built."""
    bomb = hostile_user.write(user_dir / "bomb.data", hf.tiny_lists_bomb())
    assert 200_000 < bomb.stat().st_size < 300_000
    run = run_measured(["report", "-i", str(bomb), "--format", "json"], tmp_path, timeout=120)
    run.assert_sane(max_wall_s=QUICK_S)
    assert run.returncode == 1, run.describe()
    assert_one_line(run.stderr, "report of the bomb")


@pytest.mark.parametrize("variant", sorted(hf.huge_number_records()))
@pytest.mark.parametrize("form", ["json", "table"])
def test_report_huge_numbers(hostile_user, user_dir, tmp_path, variant, form):
    """10**400 where a count, pid, address or frequency goes (no recording holds one): a one-line error,
    exit 1, never an internal error's 70."""
    path = hostile_user.write(user_dir / f"{variant}.data", hf.huge_number_records()[variant])
    run = run_measured(["report", "-i", str(path), "--format", form], tmp_path)
    outcome_ok(run)
    assert run.returncode == 1, run.describe()


@pytest.mark.parametrize("variant", sorted(hf.broken_jitdumps()))
@pytest.mark.parametrize("command", ["show", "convert"])
def test_broken_jitdumps(hostile_user, user_dir, tmp_path, variant, command):
    path = hostile_user.write(user_dir / f"jit-{variant}.dump", hf.broken_jitdumps()[variant])
    extra = ["-o", str(tmp_path / "out.elf")] if command == "convert" else []
    outcome_ok(run_measured(["jit", command, str(path), *extra], tmp_path))


def test_jit_convert_huge_range(hostile_user, user_dir, tmp_path):
    """A 14-byte perf map naming 8 GiB of code: memory bounded by what the file contains (no code)."""
    path = hostile_user.write(user_dir / "perf-4242.map", hf.huge_perf_map_range())
    run = run_measured(["jit", "convert", str(path), "-o", str(tmp_path / "huge.elf")], tmp_path, timeout=120)
    outcome_ok(run, max_wall_s=5)
    assert run.peak_rss_kb < 256 << 10, run.describe()
    if run.returncode == 0:
        assert (tmp_path / "huge.elf").stat().st_size < 1 << 20


@pytest.mark.parametrize("blanks", [40_000, 150_000])
def test_jit_show_long_blank_line(hostile_user, user_dir, tmp_path, blanks):
    """``1 1`` then blanks: linear parsing (or a length cap), the valid line still listed."""
    data = hf.blanks_map().replace(hf.BLANKS_LINE, b"1 1" + b" " * blanks + b"\n")
    path = hostile_user.write(user_dir / "perf-4243.map", data)
    run = run_measured(["jit", "show", str(path)], tmp_path, timeout=300)
    outcome_ok(run, max_wall_s=3)
    assert run.returncode == 0 and "hostile_blanks_jit" in run.stdout, run.describe()


def test_jit_show_escapes(hostile_user, user_dir, tmp_path):
    path = hostile_user.write(user_dir / "perf-4244.map", hf.escapes_map())
    run = run_measured(["jit", "show", str(path)], tmp_path)
    outcome_ok(run)
    assert run.returncode == 0 and "hostile" in run.stdout, run.describe()
    for stream in (run.stdout, run.stderr):
        assert not any(ch in stream for ch in "\x1b\x07\x9b"), "raw control characters reach the terminal"


def test_report_escapes_in_user_record(hostile_user, user_dir, tmp_path):
    """A record file the user made, with escapes in a symbol and a command name: the table shows none."""
    doc = hf.record_json()
    doc["frames"][0]["symbol"] = f"main{hf.ESCAPES}"
    doc["samples"][0]["comm"] = f"x{hf.ESCAPES}"
    path = hostile_user.write(user_dir / "escapes.data", record_file_bytes(json.dumps(doc).encode()))
    run = run_measured(["report", "-i", str(path)], tmp_path)
    outcome_ok(run)
    for stream in (run.stdout, run.stderr):
        assert not any(ch in stream for ch in "\x1b\x07\x9b"), "raw control characters reach the terminal"


@pytest.fixture
def victim(secret: Secret) -> Path:
    """A root-only (0600) file of this test, holding the secret."""
    path = secret.folder / f"victim-{secrets.token_hex(4)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret.marker)
    yield path
    path.unlink()


@pytest.fixture
def planted_symlink(hostile_user: HostileUser, victim: Path) -> Path:
    """/tmp/<name> planted by the user, pointing at the root-only victim."""
    path = Path(f"/tmp/optrace-hostile-{secrets.token_hex(4)}.out")
    hostile_user.run("ln", "-s", victim, path)
    yield path
    if path.is_symlink() or path.exists():
        path.unlink()


@pytest.mark.parametrize("command", ["report", "jit convert"])
def test_output_onto_planted_symlink(hostile_user, user_dir, tmp_path, secret, victim, planted_symlink, command):
    """``-o`` replaces the planted name (or fails): the root-only file it points at is untouched."""
    if command == "report":
        source = hostile_user.write(user_dir / "small.data", record_file_bytes(json.dumps(hf.record_json()).encode()))
        args = ["report", "-i", str(source), "-o", str(planted_symlink)]
    else:
        source = hostile_user.write(user_dir / "perf-4245.map", b"7000000 10 f\n")
        args = ["jit", "convert", str(source), "-o", str(planted_symlink)]
    run = run_measured(args, tmp_path)
    outcome_ok(run)
    assert victim.read_text() == secret.marker, f"{command} -o wrote through the planted symlink"
    assert victim.stat().st_uid == 0 and victim.stat().st_mode & 0o777 == 0o600
    if run.returncode == 0:
        assert not planted_symlink.is_symlink() and planted_symlink.stat().st_size > 0


AGENT_SCRIPT = """
import sys
from optrace.jitmaps.agent import AgentError, open_agent
print(flush=True)
sys.stdin.readline()
try:
    with open_agent(jitdump=False) as agent:
        agent.write_native_code("f", 0x7000000, 16)
    print("wrote")
except AgentError as exc:
    print("refused:", str(exc).splitlines()[0])
"""


def test_agent_with_planted_fifo(hostile_user):
    """A FIFO at /tmp/perf-PID.map before a JIT process opens its map: the process does not block."""
    proc = subprocess.Popen([sys.executable, "-c", AGENT_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    fifo = Path(f"/tmp/perf-{proc.pid}.map")
    try:
        proc.stdout.readline()
        hostile_user.run("mkfifo", fifo)
        started = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=5)
        assert time.monotonic() - started < 5
        assert proc.returncode == 0 and out.strip().startswith(("refused:", "wrote")), out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if fifo.exists() or fifo.is_symlink():
            fifo.unlink()
