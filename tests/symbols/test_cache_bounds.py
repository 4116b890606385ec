"""A symbolizer that runs for months (`optrace serve`) keeps bounded caches: many distinct programs come
and go, and only the most recently used objects, frames, build-ids and warnings are kept. One call to
symbolize never loses what it uses (a one-shot `record` behaves as without limits)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from optrace.model import RawSample, UserFrame
from optrace.frontend.symbols import Symbolizer
from optrace.frontend.symbols.buildid import read_build_id_file
from optrace.frontend.symbols.lru import LruCache
from optrace.frontend.symbols.symbolizer import CacheLimits

PROGRAMS = 24
LIMITS = CacheLimits(dsos=4, frames=8, missing=5, warnings=3)


def distinct_copies(program: Path, directory: Path, count: int) -> list[tuple[Path, bytes]]:
    """``count`` copies of ``program``, each with its own build-id (the note's bytes rewritten)."""
    data = program.read_bytes()
    build_id = read_build_id_file(str(program))
    assert data.count(build_id) == 1
    directory.mkdir()
    copies = []
    for index in range(count):
        new_id = index.to_bytes(4, "big") + build_id[4:]
        copy = directory / f"prog{index}"
        copy.write_bytes(data.replace(build_id, new_id))
        copy.chmod(0o755)
        assert read_build_id_file(str(copy)) == new_id
        copies.append((copy, new_id))
    return copies


@pytest.fixture
def copies(tmp_path: Path, program: Path) -> list[tuple[Path, bytes]]:
    return distinct_copies(program, tmp_path / "copies", PROGRAMS)


def sample(build_id: bytes, offset: int) -> RawSample:
    return RawSample(1, "t", (UserFrame(build_id, offset),), (), 1)


def names(symbolizer: Symbolizer, samples: list[RawSample]) -> list[str]:
    frames, rows = symbolizer.symbolize(samples)
    return [frames[row.frames[0]].symbol for row in rows]


def test_many_programs_keep_the_caches_within_their_limits(copies, program: Path, elf) -> None:
    alpha, gamma = elf.offset_of(program, "alpha"), elf.offset_of(program, "gamma_fn")
    symbolizer = Symbolizer(debug_roots=(), limits=LIMITS)
    for path, build_id in copies:
        symbolizer.add_executable(str(path))
        assert names(symbolizer, [sample(build_id, alpha), sample(build_id, gamma)]) == ["alpha", "gamma_fn"]
        sizes = symbolizer.cache_sizes()
        assert sizes["dsos"] <= LIMITS.dsos and sizes["frames"] <= LIMITS.frames
    assert symbolizer.stats["dsos_loaded"] == PROGRAMS
    assert symbolizer.stats["dsos_evicted"] == PROGRAMS - LIMITS.dsos


def test_one_call_keeps_every_object_it_uses_then_trims_least_recently_used(copies, program: Path, elf) -> None:
    alpha, gamma = elf.offset_of(program, "alpha"), elf.offset_of(program, "gamma_fn")
    symbolizer = Symbolizer(debug_roots=(), limits=LIMITS)
    for path, _ in copies:
        symbolizer.add_executable(str(path))
    ids = [build_id for _, build_id in copies]
    one_call = [sample(i, alpha) for i in ids] + [sample(i, gamma) for i in ids]
    assert names(symbolizer, one_call) == ["alpha"] * PROGRAMS + ["gamma_fn"] * PROGRAMS
    assert symbolizer.stats["dsos_loaded"] == PROGRAMS  # nothing evicted (and loaded again) mid-call
    assert symbolizer.cache_sizes()["dsos"] == LIMITS.dsos
    assert names(symbolizer, [sample(ids[-1], alpha + 1)]) == ["alpha"]  # recently used: still loaded
    assert symbolizer.stats["dsos_loaded"] == PROGRAMS
    assert names(symbolizer, [sample(ids[0], alpha + 1)]) == ["alpha"]  # evicted: loaded again, same name
    assert symbolizer.stats["dsos_loaded"] == PROGRAMS + 1


def test_unknown_build_ids_and_warnings_are_bounded(tmp_path: Path) -> None:
    symbolizer = Symbolizer(debug_roots=(), limits=LIMITS)
    symbolizer.machine.scan_standard_dirs(())  # no library-dir scan: every build-id below is unknown
    for index in range(50):
        frames, _ = symbolizer.symbolize([sample(index.to_bytes(20, "big"), 0x1000)])
        assert not frames[0].resolved
        symbolizer.add_executable(str(tmp_path / f"missing{index}"))
    sizes = symbolizer.cache_sizes()
    assert sizes["missing"] == LIMITS.missing
    assert sizes["warned"] == LIMITS.warnings
    assert len(symbolizer.warnings) == 50  # each new warning still reported once


def test_machine_index_is_bounded_but_keeps_the_files_of_known_processes(copies, program: Path, elf) -> None:
    limits = CacheLimits(indexed_files=6)
    symbolizer = Symbolizer(debug_roots=(), limits=limits)
    symbolizer.snapshot_process(os.getpid())  # a live process: its files stay indexed
    own_files = set(symbolizer.machine.files.keys())
    assert len(own_files) > limits.indexed_files
    for path, build_id in copies:
        symbolizer.add_executable(str(path))
        assert names(symbolizer, [sample(build_id, elf.offset_of(program, "alpha"))]) == ["alpha"]
        assert own_files <= set(symbolizer.machine.files.keys())
    sizes = symbolizer.cache_sizes()
    assert sizes["indexed_files"] == len(own_files)
    assert sizes["indexed_build_ids"] <= len(own_files)  # of the 24 copies and libc, only live files stay
    symbolizer.forget_process(os.getpid())
    names(symbolizer, [])
    assert symbolizer.cache_sizes()["indexed_files"] == limits.indexed_files


def test_lru_cache_evicts_least_recently_used() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    deferred: LruCache[str, int] = LruCache(1, trim_on_put=False)
    deferred.put("x", 1)
    deferred.put("y", 2)
    assert len(deferred) == 2 and deferred.trim() == 1 and deferred.keys() == ["y"]
    deferred.put("z", 3)
    assert deferred.trim(keep={"y"}) == 1 and deferred.keys() == ["y"]
    assert deferred.evict_oldest() == 2 and len(deferred) == 0
    with pytest.raises(KeyError):
        deferred.evict_oldest()
    with pytest.raises(ValueError):
        LruCache(0)


def test_record_sized_defaults_do_not_evict(copies, program: Path, elf) -> None:
    """The default limits hold every object of a recording of this size: nothing evicted."""
    symbolizer = Symbolizer(debug_roots=())
    for path, build_id in copies:
        symbolizer.add_executable(str(path))
        names(symbolizer, [sample(build_id, elf.offset_of(program, "alpha"))])
    assert symbolizer.stats.get("dsos_evicted", 0) == 0 and symbolizer.cache_sizes()["dsos"] == PROGRAMS



def test_symbol_tables_fit_the_byte_budget(copies, program: Path, elf) -> None:
    alpha = elf.offset_of(program, "alpha")
    probe = Symbolizer(debug_roots=())
    probe.add_executable(str(copies[0][0]))
    names(probe, [sample(copies[0][1], alpha)])
    one_table = probe.cache_sizes()["table_bytes"]
    assert one_table > 0
    symbolizer = Symbolizer(debug_roots=(), limits=CacheLimits(table_bytes=int(2.5 * one_table)))
    for path, build_id in copies:
        symbolizer.add_executable(str(path))
        assert names(symbolizer, [sample(build_id, alpha)]) == ["alpha"]
        sizes = symbolizer.cache_sizes()
        assert sizes["dsos"] <= 2 and sizes["table_bytes"] <= 2.5 * one_table
    assert symbolizer.stats["dsos_evicted"] == PROGRAMS - 2
