"""Beyond issue 8's table, found by its harness: the hostile user forges another program's build-id.

optrace knows ELF files by build-id. A build-id is a claim the file makes about itself, and anyone can
copy one (``ld --build-id=0x...``; root's binaries' ids are public). The user runs a program of its own
with the build-id of root's program (and a function of its choosing where root's program burns), then
root's program runs: its samples must still be named from its own file, not from the user's (and the
user's from the user's: which of the two optrace meets first is up to the scheduler).
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from hostilekit import Running, kill_group, still_loaded, run_measured

pytestmark = [pytest.mark.bpf]
BUILD_ID = "0x" + "5a" * 20
SPOOFED = "spoofed_by_user"


def _build(run_as, output, *flags: str) -> None:
    run_as("gcc", "-O1", "-fno-omit-frame-pointer", "-g", f"-Wl,--build-id={BUILD_ID}", *flags, "-o", output,
           output.parent.parent / "src" / "burn.c")


def test_forged_build_id_does_not_rename_roots_program(bpf_ready, hostile_user, user_bin, tmp_path):
    spoofer = user_bin / "hspoofer"
    _build(hostile_user.run, spoofer, f"-Dhostile_burn={SPOOFED}")
    victim_dir = tmp_path / "root-bin"
    victim_dir.mkdir()
    victim = victim_dir / "hvictim"
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-g", f"-Wl,--build-id={BUILD_ID}", "-o", str(victim),
                    str(user_bin.parent / "src" / "burn.c")], check=True)
    out = tmp_path / "spoof.data"
    running = Running(["record", "-a", "-F", "99", "-d", "4", "-o", str(out)], tmp_path)
    first = second = None
    try:
        running.wait_attached()
        first = hostile_user.spawn(spoofer)
        time.sleep(1.5)
        second = subprocess.Popen([str(victim)], start_new_session=True)
    finally:
        run = running.finish(timeout=60)
        for proc in (first, second):
            if proc is not None:
                kill_group(proc)
    assert run.returncode == 0, run.describe()
    assert not still_loaded(run.prog_ids)
    report = run_measured(["report", "-i", str(out), "--format", "json", "--comm", "hvictim,hspoofer"], tmp_path)
    rows = json.loads(report.stdout)["rows"]
    victims = [r for r in rows if r["comm"] == "hvictim" and not r["kernel"]]
    spoofers = [r for r in rows if r["comm"] == "hspoofer" and not r["kernel"]]
    assert victims and spoofers, f"both programs must be sampled: {rows}"
    # Whichever of the two files optrace met first, each program is named from its own file.
    assert not [r for r in victims if SPOOFED in r["symbol"] or "hspoofer" in r["dso"]], victims
    assert not [r for r in spoofers if "hvictim" in r["dso"]], spoofers
