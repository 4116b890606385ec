"""The recorder's JIT source on real processes: perf maps read as they grow, jitdumps found in
/proc/PID/maps, maps written at exit, pid namespaces, and a dump that names another pid."""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from jithelpers import PROGRAMS, PYTHON, needs_root, wait_for
from optrace.jitmaps import jitsymbols
from optrace.jitmaps.jitsymbols import JitSymbols


def test_perf_map_read_incrementally_and_reuse_named_by_poll_time(spawn):
    proc = spawn(["sleep", "30"])
    path = f"/tmp/perf-{proc.pid}.map"
    jit = JitSymbols()
    with open(path, "w") as f:
        f.write("0x1000 0x100 first version\n2000 10 other")  # second line not finished yet
    jit.poll(proc.pid, 10.0)
    assert jit.lookup(proc.pid, 0x2004, 10.0) is None
    with open(path, "a") as f:
        f.write("\n1000 100 second version\n")
    jit.poll(proc.pid, 11.0)
    assert jit.lookup(proc.pid, 0x1010, 10.0) == ("first version", path)
    assert jit.lookup(proc.pid, 0x1010, 11.0) == ("second version", path)
    assert jit.lookup(proc.pid, 0x2004, 11.0) == ("other", path)
    assert jit.stats["perfmap_lines"] == 3


def test_map_written_at_exit_is_read_at_exit(spawn):
    proc = spawn(["sh", "-c", 'read x; echo "3000 40 written_at_exit" > /tmp/perf-$$.map'],
                 stdin=subprocess.PIPE)
    jit = JitSymbols()
    jit.poll(proc.pid, 1.0)
    proc.communicate(b"go\n")
    jit.process_exited(proc.pid, 2.0)
    assert jit.lookup(proc.pid, 0x3010, 1.0) == ("written_at_exit", f"/tmp/perf-{proc.pid}.map")


def test_last_line_without_newline_counts_at_finish(spawn):
    proc = spawn(["sleep", "30"])
    with open(f"/tmp/perf-{proc.pid}.map", "w") as f:
        f.write("1000 10 no_newline")
    jit = JitSymbols()
    jit.poll(proc.pid, 1.0)
    assert jit.lookup(proc.pid, 0x1000, 1.0) is None
    jit.finish(2.0)
    assert jit.lookup(proc.pid, 0x1000, 1.0)[0] == "no_newline"


@pytest.mark.parametrize("seconds", [0.0, 60.0])
def test_the_end_reads_more_of_a_big_map_for_a_bounded_time(spawn, monkeypatch, seconds):
    """At the recording's end, a map larger than a drain's read is read on, READ_BUDGET at a time, for
    FINAL_READ_SECONDS: with no time left only the drain's and the exit's reads are made (the rest counted unread), with
    time, the whole map."""
    monkeypatch.setattr(jitsymbols, "FINAL_READ_SECONDS", seconds)
    proc = spawn(["sleep", "30"])
    lines = 6 * jitsymbols.READ_BUDGET // 40
    with open(f"/tmp/perf-{proc.pid}.map", "w") as f:
        f.writelines(f"{0x100000 + 16 * i:x} 10 function_{i:09d}_padding_\n" for i in range(lines))  # 40 bytes
    reference = JitSymbols()
    reference.poll(proc.pid, 1.0)
    reference.process_exited(proc.pid, 2.0)
    jit = JitSymbols()
    jit.poll(proc.pid, 1.0)  # a drain's read
    jit.finish(2.0)  # the exit's read, then the rest's
    read = jit.stats["perfmap_lines"]
    if seconds:
        assert read == lines and not jit.stats["unread_bytes"]
    else:
        assert read == reference.stats["perfmap_lines"] < lines and jit.stats["unread_bytes"] > 0


def test_the_end_does_not_read_again_what_cannot_be_read_further(tmp_path, monkeypatch):
    """A jitdump whose last record is incomplete (its JIT killed mid-write) keeps bytes past what it read even
    at the final read: the end reads it once more, then leaves it (it was re-opened in a loop for all of
    FINAL_READ_SECONDS)."""
    from jithelpers import dump_bytes, load

    monkeypatch.setattr(jitsymbols, "FINAL_READ_SECONDS", 60.0)
    whole = dump_bytes([load(0x7000, 0x10, "complete_fn", 1), load(0x8000, 0x10, "cut_fn", 2)], pid=999999)
    path = tmp_path / "cut.dump"
    path.write_bytes(whole[:-10])
    reads = []
    original = JitSymbols._read
    monkeypatch.setattr(JitSymbols, "_read", lambda self, *args: reads.append(1) or original(self, *args))
    jit = JitSymbols(jitdumps=[str(path)])
    jit.finish(9.0)
    assert jit.lookup(999999, 0x7004, 6.0) == ("complete_fn", str(path))
    assert len(reads) <= 3


def test_jitdump_found_in_proc_maps(spawn, tmp_path):
    proc = spawn([PYTHON, str(PROGRAMS / "agent_child.py"), str(tmp_path), "dumped_fn:5000:80"],
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    dump = proc.stdout.readline().split()[1]
    os.unlink(f"/tmp/perf-{proc.pid}.map")  # only the jitdump may name it
    jit = JitSymbols()
    jit.poll(proc.pid, 1e9)
    assert jit.lookup(proc.pid, 0x5010, 1e9) == ("dumped_fn", dump)
    assert jit.stats["jitdump_records"] >= 1


def test_jitdump_naming_another_pid_is_refused(spawn, tmp_path):
    """A process cannot pose as another's agent: the dump header must name the process itself."""
    script = textwrap.dedent(f"""
        import mmap, os, sys
        sys.path.insert(0, {str(PROGRAMS.parent)!r})
        from jithelpers import dump_bytes, load
        path = os.path.join({str(tmp_path)!r}, f"jit-{{os.getpid()}}.dump")
        with open(path, "wb") as f:
            f.write(dump_bytes([load(0x5000, 0x80, "posing", 1)], pid=1))
        fd = os.open(path, os.O_RDONLY)
        m = mmap.mmap(fd, 40, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
        print("ready", flush=True)
        sys.stdin.read()
    """)
    proc = spawn([PYTHON, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    jit = JitSymbols()
    jit.poll(proc.pid, 1e9)
    assert jit.lookup(proc.pid, 0x5010, 1e9) is None
    assert jit.stats["refused_corrupt"] == 1 and "header names pid 1" in jit.warnings[0]


def test_explicit_jitdump(tmp_path):
    from jithelpers import dump_bytes, load
    path = tmp_path / "elsewhere.dump"
    path.write_bytes(dump_bytes([load(0x7000, 0x10, "explicit_fn", 5_000_000_000)], pid=999999))
    jit = JitSymbols(jitdumps=[str(path)])
    jit.finish(9.0)
    assert jit.lookup(999999, 0x7004, 6.0) == ("explicit_fn", str(path))


def test_explicit_jitdump_bad_input_is_one_clear_error(tmp_path):
    from optrace.errors import OptraceError
    (tmp_path / "bad.dump").write_bytes(b"not a dump at all, no no no no no no no no")
    with pytest.raises(OptraceError, match="bad magic"):
        JitSymbols(jitdumps=[str(tmp_path / "bad.dump")])
    with pytest.raises(OptraceError, match="no such file"):
        JitSymbols(jitdumps=[str(tmp_path / "missing.dump")])


def _inner_pid(outer) -> int:
    assert outer.stdout.readline().strip() == "ok"
    children = wait_for(lambda: open(f"/proc/{outer.pid}/task/{outer.pid}/children").read().split())
    return int(children[0])


# A container-like root: a tmpfs with the system's /usr bind-mounted in, the map in its own tmp/ (no mount
# point between the root and the map), the process chrooted there as pid 1 of its pid namespace.
CONTAINER = (
    'root="$0" && mount -t tmpfs none "$root" && mkdir "$root/usr" "$root/tmp" && '
    'mount --bind /usr "$root/usr" && for d in bin lib lib64 sbin; do ln -s usr/$d "$root/$d"; done && '
    'echo "6000 20 in_container" > "$root/tmp/perf-1.map" && echo ok && exec chroot "$root" sleep 30')


def test_process_in_another_pid_and_mount_namespace(spawn, tmp_path):
    """/proc/PID/root/tmp/perf-NSPID.map, resolved inside the process's root (NSpid from /proc/PID/status:
    here 1); the host's /tmp/perf-1.map is not it."""
    needs_root()
    outer = spawn(["unshare", "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c", CONTAINER, str(tmp_path)],
                  stdout=subprocess.PIPE, text=True)
    inner = _inner_pid(outer)
    wait_for(lambda: os.readlink(f"/proc/{inner}/root") != "/")  # chroot done
    assert not os.path.exists("/tmp/perf-1.map") or open("/tmp/perf-1.map").read().find("in_container") < 0
    jit = JitSymbols()
    jit.poll(inner, 1.0)
    assert jit.lookup(inner, 0x6010, 1.0) == ("in_container", f"/proc/{inner}/root/tmp/perf-1.map")
    assert jit.warnings == []


def test_map_behind_a_mount_point_in_another_namespace_is_refused(spawn):
    """A tmpfs mounted on the namespace's /tmp (systemd's PrivateTmp looks like this): the map is behind a
    mount point, which is never crossed (a bind mount of someone else's file looks the same): refused,
    one warning. Before issue 8 this map was read."""
    needs_root()
    script = 'mount -t tmpfs none /tmp && echo "6000 20 in_container" > /tmp/perf-1.map && echo ok && exec sleep 30'
    outer = spawn(["unshare", "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c", script],
                  stdout=subprocess.PIPE, text=True)
    inner = _inner_pid(outer)
    jit = JitSymbols()
    jit.poll(inner, 1.0)
    assert jit.lookup(inner, 0x6010, 1.0) is None
    assert jit.stats["refused_mount"] == 1
    assert jit.warnings == [f"JIT symbols: /proc/{inner}/root/tmp/perf-1.map: ignored: it crosses a mount point "
                            "(not followed)"]


def test_reused_pid_gets_its_own_symbols(spawn):
    """After an exit, a new process with the same pid (told apart by its start time) starts afresh;
    samples from before are still named from the old process's map."""
    from dataclasses import replace

    from optrace.jitmaps.procinfo import read_identity
    proc = spawn(["sleep", "30"])
    path = f"/tmp/perf-{proc.pid}.map"
    with open(path, "w") as f:
        f.write("1000 100 old_process\n")
    jit = JitSymbols()
    jit.poll(proc.pid, 1.0)
    jit.process_exited(proc.pid, 2.0)
    old = jit._procs[proc.pid][0]
    old.identity = replace(old.identity, start_ticks=-1)  # as if that process had died and the pid was reused
    with open(path, "w") as f:
        f.write("1000 100 new_process\n")
    jit.poll(proc.pid, 3.0)
    assert jit.lookup(proc.pid, 0x1010, 1.0)[0] == "old_process"
    assert jit.lookup(proc.pid, 0x1010, 3.0)[0] == "new_process"
    assert read_identity(proc.pid).start_ticks > 0


def test_jitdumps_mapped_by_one_process_are_bounded(spawn, tmp_path, monkeypatch):
    """A process mapping many files named jit-PID.dump costs at most MAX_JITDUMPS sources (one warning)."""
    import optrace.jitmaps.jitsymbols as jitsymbols
    monkeypatch.setattr(jitsymbols, "MAX_JITDUMPS", 3)
    script = textwrap.dedent(f"""
        import mmap, os, sys
        sys.path.insert(0, {str(PROGRAMS.parent)!r})
        from jithelpers import dump_bytes, load
        keep = []
        for i in range(8):
            folder = os.path.join({str(tmp_path)!r}, str(i))
            os.mkdir(folder)
            path = os.path.join(folder, f"jit-{{os.getpid()}}.dump")
            with open(path, "wb") as f:
                f.write(dump_bytes([load(0x5000 + 0x100 * i, 0x80, f"fn{{i}}", 1)], pid=os.getpid()))
            fd = os.open(path, os.O_RDONLY)
            keep.append(mmap.mmap(fd, 40, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC))
        print("ready", flush=True)
        sys.stdin.read()
    """)
    proc = spawn([PYTHON, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    jit = JitSymbols()
    jit.poll(proc.pid, 1e9)
    named = [jit.lookup(proc.pid, 0x5010 + 0x100 * i, 1e9) for i in range(8)]
    assert sum(1 for n in named if n) == 3  # the perf map source and 3 dumps: more than 3 sources stops
    assert jit.stats["refused_too_many_jitdumps"] == 1
    assert jit.warnings == [f"JIT symbols: /proc/{proc.pid}/maps: more than 3 jitdumps mapped: the others are ignored"]
