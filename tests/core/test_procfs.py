from __future__ import annotations

import os
import sys

import pytest

from optrace.procfs import MapEntry, cgroup_container_id, command_line, executable, parse_maps

TEXT = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 1234                       /opt/my app/demo
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:00 1234                       /opt/my app/demo
7f0000000000-7f0000001000 r-xp 00002000 fe:00 99                         /tmp/lib.so (deleted)
7f0000100000-7f0000200000 rwxp 00000000 00:00 0 
7f0000300000-7f0000301000 rwxs 00000000 00:01 77                         /dev/zero (deleted)
7ffd1b1fe000-7ffd1b200000 r-xp 00000000 00:00 0                          [vdso]
"""


def test_parse_maps_paths_with_spaces_deleted_and_anonymous() -> None:
    entries = parse_maps(TEXT)
    assert entries[1] == MapEntry(0x55D0C0A01000, 0x55D0C0A02000, "r-xp", 0x1000, "fe:00", 1234, "/opt/my app/demo")
    assert entries[1].file_offset(0x55D0C0A01010) == 0x1010 and entries[1].executable and entries[1].is_file
    assert entries[2].file_path == "/tmp/lib.so" and entries[2].is_file
    assert entries[3].path == "" and not entries[3].is_file and entries[3].executable
    assert not entries[4].is_file  # shared anonymous memory, not an ELF object
    assert entries[5].path == "[vdso]" and not entries[5].is_file


ID = "b1eba9dfaeba29d8b80532a574a03ea3cac29384327f339c26da13649e2120df"


@pytest.mark.parametrize("text,expected", [
    (f"0::/system.slice/docker-{ID}.scope\n", ID),  # cgroup v2, systemd driver
    (f"0::/system.slice/docker-{ID}.scope/init\n", ID),  # a cgroup the runtime made inside it
    (f"12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n", ID),  # v1, cgroupfs driver
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope\n", ID),
    (f"0::/machine.slice/libpod-{ID}.scope/container\n", ID),  # podman
    ("0::/ecs/0123456789abcdef0123456789abcdef/0123456789abcdef0123456789abcdef-1234567890\n",
     "0123456789abcdef0123456789abcdef-1234567890"),  # ECS task
    ("0::/user.slice/user-1000.slice/app.slice/vte-spawn-868f9513-eee8-457d-8e36-1b37ae8ae622.scope\n", None),
    ("4:memory:/process_api/70396190558bef3b6cb0242d30a8459c\n0::/\n", None),  # not a container runtime's id
    (f"0::/docker-{ID}x.scope\n", None),
    ("", None),
])
def test_container_id_from_the_cgroup_paths(text: str, expected: str | None) -> None:
    assert cgroup_container_id(text) == expected


def test_a_process_reads_as_itself() -> None:
    me = os.getpid()
    assert executable(me) == os.path.realpath(sys.executable)
    assert command_line(me) == sys.orig_argv
    assert executable(2) is None and command_line(2) is None  # kthreadd: a kernel thread has neither


def test_descendants_are_children_and_their_children_not_the_processes_themselves() -> None:
    """A shell with a child shell that has a sleep: both are descendants of the first (procfs.descendants,
    --subprocesses); an unrelated process is not."""
    import subprocess
    import time

    from optrace.procfs import descendants

    tree = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30 & wait' & wait"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        found: set[int] = set()
        while len(found) < 2 and time.monotonic() < deadline:
            found = descendants([tree.pid])
            time.sleep(0.02)
        assert len(found) == 2 and tree.pid not in found and other.pid not in found, found
        assert descendants([other.pid]) == set()
    finally:
        for proc in (tree, other):
            proc.kill()
            proc.wait()
