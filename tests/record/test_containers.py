"""A process in another root and mount namespace (``unshare --mount --fork --root=DIR``, the simplest
container): its binary exists only inside that root, under a path that names nothing here. Its files are read
through the process (its mappings), so its frames are named, also after it exits, and no warning says
otherwise (real BPF, needs root)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from support import run_optrace

pytestmark = pytest.mark.usefixtures("bpf_ready")

SPIN = r"""
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((noinline)) unsigned boxed_leaf(unsigned x)
{
    for (int i = 0; i < 100000; i++)
        x = x * 1103515245u + 12345u;
    return x;
}
__attribute__((noinline)) unsigned boxed_caller(unsigned x) { return boxed_leaf(x) + 1; }
int main(void)
{
    double end = now() + 2;
    volatile unsigned sink = 0;
    while (now() < end)
        sink = boxed_caller(sink);
    return 0;
}
"""
BINARY = "/bin/boxed-spin"  # inside the root; nothing here has this path


def container_root(tmp_path: Path) -> Path:
    """A root holding a binary built without frame pointers, the dynamic loader and libc (copies: their
    paths inside the root name other files here)."""
    root = tmp_path / "root"
    for folder in ("bin", "lib/x86_64-linux-gnu", "lib64"):
        (root / folder).mkdir(parents=True)
    source = tmp_path / "spin.c"
    source.write_text(SPIN)
    subprocess.run(["cc", "-O2", "-fomit-frame-pointer", "-Wl,--build-id", "-o", str(root / BINARY.lstrip("/")),
                    str(source)], check=True)
    shutil.copy2("/lib/x86_64-linux-gnu/libc.so.6", root / "lib/x86_64-linux-gnu")
    shutil.copy2("/lib64/ld-linux-x86-64.so.2", root / "lib64")
    assert not Path(BINARY).exists()
    return root


def test_a_binary_only_in_a_container_root_is_named_without_a_warning(tmp_path):
    """The whole machine while a shell runs the container's binary for 2 s, then waits 2 s more: the binary is
    gone before the recording ends. Its samples are named from its own file, and the record warns about no file
    of it (how far its stacks reach is test_first_samples.py's matter: on a loaded machine its first copies
    may give up waiting for its tables and keep their leaf alone). The exec event may be read after the process is gone (a
    busy drain loop): its files come from the mappings captured at its first copied sample."""
    root = container_root(tmp_path)
    out = tmp_path / "box.data"
    run_optrace("record", "-a", "-F", "499", "-o", str(out), "--", "sh", "-c",
                f"unshare --mount --fork --root={root} {BINARY}; sleep 2", check=True, timeout=300)
    doc = json.loads(run_optrace("report", "-i", str(out), "--comm", "boxed-spin", "--children", "--sort", "dso,symbol",
                                 "--format", "json", check=True).stdout)
    # (the file as /proc/PID/maps shows it from here: the root is a folder of this tree)
    rows = {(Path(row["dso"]).name, row["symbol"]): row for row in doc["rows"]}
    leaf = rows.get(("boxed-spin", "boxed_leaf"))
    assert leaf is not None and leaf["samples"] >= 20, (sorted(rows), doc["meta"]["warnings"])
    named = sum(row["samples"] for (dso, symbol), row in rows.items() if "+0x" not in symbol and symbol != "[unknown]")
    assert named >= 0.97 * sum(row["samples"] for row in rows.values())
    warnings = doc["meta"]["warnings"]
    assert not [w for w in warnings if "boxed-spin" in w or "/lib64/ld-linux" in w], warnings
