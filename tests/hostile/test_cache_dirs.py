"""Issue 40, item 5: the folders root's optrace keeps files in between runs (its compiled BPF programs,
unwind tables and kernel symbols: optrace/cachedir.py, one class for the three), attacked by an
unprivileged user where the cache is put below /tmp (``OPTRACE_CACHE_DIR=/tmp/...``, as tests and
benchmarks do). No BPF: the cache directory is what is attacked.

- A symlink of the user's on the way (``/tmp/cache -> a folder of root's``): root's entries were written
  there, and its least-recently-used trim deleted that folder's files. Now: not followed, nothing kept.
- A folder of the user's on the way (made before root's first run): its owner may rename root's private
  folder away and put another in its place between runs. Now: not used.
- A world-writable folder without the sticky bit on the way: anyone may do the same. Now: not used.
- The cache folder itself made by the user, or a symlink of the user's in its place: refused before too.
Each time the run goes on without a cache (a compile instead of a load), with the reason in ``problem``.
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostilekit import HostileUser
from optrace.cachedir import CacheDirectory

MAGIC = b"optrace test entry\n"


@pytest.fixture
def roots_folder() -> Iterator[Path]:
    """A folder of root's with a ``programs`` folder holding a root-only file: what a link may lead to."""
    base = Path(tempfile.mkdtemp(prefix="optrace-roots-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    (base / "programs").mkdir(mode=0o700)
    victim = base / "programs" / "victim"
    victim.write_bytes(b"root's\n" * 1000)
    os.chmod(victim, 0o600)
    os.utime(victim, (1, 1))  # the least recently used
    yield base
    shutil.rmtree(base)


@pytest.fixture
def tmp_name() -> Iterator[Path]:
    path = Path(f"/tmp/optrace-cache-{secrets.token_hex(4)}")
    yield path
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def use_cache(directory: Path) -> CacheDirectory:
    """root's cache there, one entry written (a small bound, so that the trim runs)."""
    cache = CacheDirectory(directory, MAGIC, 4096, max_bytes=1024)
    cache.write("entry", {}, b"payload")
    return cache


def test_another_users_symlink_on_the_way_is_not_followed(hostile_user: HostileUser, roots_folder: Path, tmp_name: Path):
    hostile_user.run("ln", "-s", roots_folder, tmp_name)
    cache = use_cache(tmp_name / "programs")
    assert not cache.usable and f"symbolic link of uid {hostile_user.uid}" in cache.problem, cache.problem
    assert sorted(path.name for path in (roots_folder / "programs").iterdir()) == ["victim"]  # not trimmed away


def test_another_users_folder_on_the_way_is_not_used(hostile_user: HostileUser, tmp_name: Path):
    hostile_user.run("mkdir", "-m", "0755", tmp_name)
    cache = use_cache(tmp_name / "programs")
    assert not cache.usable and f"belongs to uid {hostile_user.uid}" in cache.problem, cache.problem
    assert list(tmp_name.iterdir()) == []


def test_a_world_writable_folder_on_the_way_is_not_used(tmp_name: Path):
    tmp_name.mkdir()
    os.chmod(tmp_name, 0o777)  # not sticky: anyone may rename what is in it
    cache = use_cache(tmp_name / "programs")
    assert not cache.usable and "may be written by other users" in cache.problem, cache.problem
    assert list(tmp_name.iterdir()) == []


@pytest.mark.parametrize("planted", ["folder", "symlink"])
def test_the_cache_folder_planted_by_another_user_is_not_used(hostile_user: HostileUser, roots_folder: Path,
                                                               tmp_name: Path, planted: str):
    """The cache folder is a name in /tmp the user took first: their folder, or their link to root's."""
    if planted == "folder":
        hostile_user.run("mkdir", "-m", "0700", tmp_name)
    else:
        hostile_user.run("ln", "-s", roots_folder / "programs", tmp_name)
    cache = use_cache(tmp_name)
    assert not cache.usable, cache.problem
    assert sorted(path.name for path in (roots_folder / "programs").iterdir()) == ["victim"]


def test_roots_own_cache_below_tmp_is_used(tmp_name: Path):
    """The case that proves the others refuse for their reason: root's own folders below sticky /tmp."""
    cache = use_cache(tmp_name / "programs")
    assert cache.usable and cache.problem is None and cache.read("entry") == ({}, b"payload")
    assert (tmp_name / "programs").stat().st_mode & 0o777 == 0o700
