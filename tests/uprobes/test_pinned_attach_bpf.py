"""A uprobe lands in the very file its offset was checked on, even if the path is swapped in between."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from optrace.errors import OptraceError
from optrace.probes import UprobeTarget
from optrace.frontend.uprobes.resolve import resolve_specs

pytestmark = pytest.mark.bpf


def test_a_path_swapped_after_the_check_attaches_nothing(bpf_ready, workloads, tmp_path) -> None:
    from optrace.bpf.uprobes import BpfUprobeAttacher

    binary = tmp_path / "calls"
    shutil.copy(workloads / "calls", binary)
    probe = resolve_specs([f"{binary}:target"]).probes[0]
    binary.rename(tmp_path / "calls.checked")
    binary.symlink_to(shutil.which("true"))  # what a hostile owner of the folder can do meanwhile
    attacher = BpfUprobeAttacher()
    try:
        with pytest.raises(OptraceError, match="replaced after it was checked"):
            attacher.attach([UprobeTarget(str(binary), probe.offset, probe.key.dev, probe.key.ino)])
        assert attacher.read().totals == {}
    finally:
        attacher.close()


def test_the_pinned_file_is_the_one_counted(bpf_ready, workloads, tmp_path) -> None:
    from optrace.bpf.uprobes import BpfUprobeAttacher

    binary = tmp_path / "calls"
    shutil.copy(workloads / "calls", binary)
    probe = resolve_specs([f"{binary}:target"]).probes[0]
    attacher = BpfUprobeAttacher()
    try:
        [probe_id] = attacher.attach([UprobeTarget(str(binary), probe.offset, probe.key.dev, probe.key.ino)])
        run = subprocess.run([str(binary), "300"], capture_output=True, text=True, timeout=30)
        assert run.returncode == 0
        assert attacher.read().totals.get(probe_id) == 300
    finally:
        attacher.close()
