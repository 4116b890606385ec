"""Issue 8's table, the count row: root runs ``optrace count BIN:0xADDR`` on the hostile user's binary.

A uprobe inside an instruction corrupts it: every process running the binary (system-wide without
``-p``) dies with SIGSEGV. An address past the function's ``ret`` is in no function and counts nothing.
Both must be a one-line error naming the nearest valid addresses, and the target must live on.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostilekit import assert_one_line, kill_group, still_loaded, run_measured

pytestmark = [pytest.mark.bpf]
FUNCTION = "hostile_burn"


@dataclass(frozen=True)
class Addresses:
    start: int
    end: int  # start + st_size: the byte after its ret, padding before the next function
    boundaries: list[int]  # every instruction's address, from the function start
    mid_instruction: int  # one byte into a multi-byte instruction of the hot loop


def _addresses(binary: Path) -> Addresses:
    nm = subprocess.run(["nm", "-S", str(binary)], capture_output=True, text=True, check=True).stdout
    start, size = next((int(v, 16), int(s, 16)) for v, s, _, name in (line.split() for line in nm.splitlines()
                                                                     if len(line.split()) == 4) if name == FUNCTION)
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={start:#x}",
                           f"--stop-address={start + size:#x}", str(binary)],
                          capture_output=True, text=True, check=True).stdout
    lines = re.findall(r"^\s*([0-9a-f]+):\s+(.*)$", dump, re.M)
    boundaries = [int(a, 16) for a, _ in lines]
    loop_head = min(int(t, 16) for a, text in lines
                    for t in re.findall(r"^j\w+\s+([0-9a-f]+) <", text) if int(t, 16) < int(a, 16))
    ends = dict(zip(boundaries, boundaries[1:] + [start + size]))
    long_one = next(a for a in boundaries if a >= loop_head and ends[a] - a >= 3)
    return Addresses(start, start + size, boundaries, long_one + 1)


@pytest.fixture
def target(bpf_ready, hostile_user, user_bin):
    """The user's binary (symbols intact), running as the user."""
    proc = hostile_user.spawn(user_bin / "burn")
    yield user_bin / "burn", proc
    kill_group(proc)


def _alive(proc: subprocess.Popen) -> None:
    assert proc.poll() is None, f"the target died: exit status {proc.returncode}"


@pytest.mark.parametrize("where", ["mid_instruction", "after_ret"])
def test_count_refuses_address_off_instruction_boundaries(target, tmp_path, where):
    binary, proc = target
    found = _addresses(binary)
    address = found.mid_instruction if where == "mid_instruction" else found.end
    assert address not in found.boundaries
    run = run_measured(["count", f"{binary}:{address:#x}", "-d", "2"], tmp_path, timeout=60)
    run.assert_sane(max_wall_s=30)
    _alive(proc)
    assert run.returncode == 1, run.describe()
    assert_one_line(run.stderr, "count at a bad address")
    before = max(a for a in found.boundaries if a < address)
    nearest = {f"{before:#x}"} | {f"{a:#x}" for a in found.boundaries if a > address} | {f"{found.start:#x}"}
    assert any(text in run.stderr for text in nearest), f"no nearby valid address named: {run.stderr}"
    assert not still_loaded(run.prog_ids)


def test_count_accepts_an_instruction_boundary(target, tmp_path):
    """The control: a real instruction inside the function is accepted, and the target lives."""
    binary, proc = target
    found = _addresses(binary)
    run = run_measured(["count", f"{binary}:{found.boundaries[1]:#x}", "-d", "1"], tmp_path, timeout=60)
    run.assert_sane(max_wall_s=30)
    assert run.returncode == 0, run.describe()
    _alive(proc)
    assert not still_loaded(run.prog_ids)
