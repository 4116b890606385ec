from __future__ import annotations

import bisect
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optrace.cachedir import CacheDirectory
from optrace.errors import OptraceError
from optrace.model import KERNEL_DSO, Frame, RawSample
from optrace.frontend.symbols import Kallsyms, Symbolizer
from optrace.frontend.symbols import kallsyms as kallsyms_module
from optrace.frontend.symbols.kallsyms import KernelSymbol
from optrace.frontend.symbols.symbol import name_preference

SAMPLE = """\
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81001000 t do_one
ffffffff81002000 D some_data
ffffffff81003000 W weak_fn
ffffffffc0201000 t ext4_thing\t[ext4]
"""


def test_parse_text_symbols_and_modules(tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text(SAMPLE)
    kallsyms = Kallsyms.load(str(tmp_path / "kallsyms"))
    assert len(kallsyms) == 4
    assert kallsyms.find(0xFFFFFFFF81000010).name == "startup_64"
    assert kallsyms.find(0xFFFFFFFF81002010).name == "do_one"  # data symbols are not functions
    assert kallsyms.find(0xFFFFFFFF81003001).name == "weak_fn"
    symbol = kallsyms.find(0xFFFFFFFFC0201004)
    assert (symbol.name, symbol.module) == ("ext4_thing", "ext4")
    assert kallsyms.find(0xFFFFFFFF80000000) is None


def test_hidden_addresses_are_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text("".join("0000000000000000" + line[16:] + "\n" for line in SAMPLE.splitlines()))
    with pytest.raises(OptraceError, match=r"kernel symbols are hidden \(kptr_restrict\): run as root"):
        Kallsyms.load(str(tmp_path / "kallsyms"))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OptraceError, match="cannot read .*nothing: No such file"):
        Kallsyms.load(str(tmp_path / "nothing"))


def test_kernel_frames_come_first_with_module_dso(tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text(SAMPLE)
    symbolizer = Symbolizer(kallsyms=Kallsyms.load(str(tmp_path / "kallsyms")), debug_roots=())
    frames, samples = symbolizer.symbolize([RawSample(1, "k", (), (0xFFFFFFFFC0201004, 0xFFFFFFFF81001008, 5), 3)])
    assert [frames[i] for i in samples[0].frames] == [
        Frame("ext4_thing", "[ext4]", kind="kernel", address=0xFFFFFFFFC0201004),
        Frame("do_one", KERNEL_DSO, kind="kernel", address=0xFFFFFFFF81001008),
        Frame(f"{KERNEL_DSO}+0x5", KERNEL_DSO, kind="kernel", address=5, resolved=False),
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="/proc/kallsyms shows addresses to root only")
def test_real_kallsyms_names_a_known_function() -> None:
    lines = Path("/proc/kallsyms").read_text().splitlines()
    address = next(int(line.split()[0], 16) for line in lines if line.split()[2] == "do_sys_openat2")
    symbolizer = Symbolizer(debug_roots=())  # loads /proc/kallsyms itself
    frames, _ = symbolizer.symbolize([RawSample(1, "k", (), (address + 1,), 1)])
    assert frames == [Frame("do_sys_openat2", KERNEL_DSO, kind="kernel", address=address + 1)]
    module_line = next((line for line in lines if line.endswith("]") and line.split()[1] in "tT"), None)
    if module_line is not None:
        module_address, _, name, module = module_line.split()
        found = symbolizer.symbolize([RawSample(1, "k", (), (int(module_address, 16),), 1)])[0][0]
        assert found.dso == module
    assert symbolizer.warnings == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to nobody")
def test_kallsyms_as_nobody_is_hidden() -> None:
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         "from optrace.frontend.symbols import Kallsyms; Kallsyms.load()"],
        capture_output=True, text=True, cwd="/", timeout=60)
    assert result.returncode != 0 and "kernel symbols are hidden (kptr_restrict): run as root" in result.stderr


def _store(directory: Path) -> CacheDirectory:
    return CacheDirectory(directory, kallsyms_module.STORE_MAGIC, kallsyms_module.MAX_TABLE_BYTES,
                          kallsyms_module.MAX_STORED_BYTES)


def _same_table(one: Kallsyms, other: Kallsyms) -> bool:
    return all(getattr(one, name) == getattr(other, name)
               for name in ("_addresses", "_name_ends", "_module_ids", "_modules", "_names"))


def test_a_stored_table_is_read_back_for_the_same_text_only(tmp_path: Path) -> None:
    """The first load parses and stores; a load of the same text reads the table back; a text that
    differs anywhere (a symbol renamed, a module loaded) is parsed again, so no name goes stale."""
    source = tmp_path / "kallsyms"
    source.write_text(SAMPLE)
    parsed = Kallsyms.load(str(source))
    first, second = _store(tmp_path / "store"), _store(tmp_path / "store")
    assert _same_table(Kallsyms.load(str(source), stored=first), parsed)
    assert first.stats == {"hits": 0, "misses": 1, "writes": 1, "bad": 0}
    again = Kallsyms.load(str(source), stored=second)
    assert second.stats["hits"] == 1 and _same_table(again, parsed)
    assert (again.find(0xFFFFFFFFC0201004).name, again.find(0xFFFFFFFFC0201004).module) == ("ext4_thing", "ext4")
    source.write_text(SAMPLE.replace("do_one", "do_two") + "ffffffffc0301000 t xfs_thing\t[xfs]\n")
    third = _store(tmp_path / "store")
    changed = Kallsyms.load(str(source), stored=third)
    assert third.stats["misses"] == 1 and third.stats["writes"] == 1
    assert changed.find(0xFFFFFFFF81001008).name == "do_two" and changed.find(0xFFFFFFFFC0301000).module == "xfs"


def test_programs_that_come_and_go_are_read_in_every_load(tmp_path: Path) -> None:
    """BPF programs (optrace's own among them) and trampolines differ from run to run: a text that differs
    only there reads the stored table back and names the programs of its own text, not the last run's."""
    source = tmp_path / "kallsyms"
    tail = "ffffffffc0400000 t bpf_prog_{}_on_sample\t[bpf]\nffffffffc0500000 t ftrace_trampoline\t[__builtin__ftrace]\n"
    source.write_text(SAMPLE + tail.format("aaaa"))
    Kallsyms.load(str(source), stored=_store(tmp_path / "store"))
    source.write_text(SAMPLE + tail.format("bbbb").replace("c0400000", "c0410000"))
    store = _store(tmp_path / "store")
    table = Kallsyms.load(str(source), stored=store)
    assert store.stats["hits"] == 1 and len(table) == 6
    assert table.find(0xFFFFFFFFC0400010) == KernelSymbol("ext4_thing", "ext4")  # the old program is gone
    assert table.find(0xFFFFFFFFC0410010) == KernelSymbol("bpf_prog_bbbb_on_sample", "bpf")
    assert table.find(0xFFFFFFFFC0500001) == KernelSymbol("ftrace_trampoline", "__builtin__ftrace")
    assert table.find(0xFFFFFFFF81001001).name == "do_one"


def test_an_alias_in_the_changing_tail_loses_to_a_preferred_one_before_it(tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text("ffffffff81000000 T alpha\nffffffffc0000000 t kept_name\t[mod]\n"
                                       "ffffffffc0000000 t __other\t[bpf]\nffffffffc0001000 t longer_name\t[mod]\n"
                                       "ffffffffc0001000 t longest_name\t[bpf]\n")
    table = Kallsyms.load(str(tmp_path / "kallsyms"))
    assert table.find(0xFFFFFFFFC0000001) == KernelSymbol("kept_name", "mod")
    assert table.find(0xFFFFFFFFC0001001) == KernelSymbol("longest_name", "bpf")
    assert table.find(0xFFFFFFFF80000000) is None


@pytest.mark.parametrize("damage", ["flipped name byte", "columns that do not match"])
def test_a_damaged_stored_table_is_parsed_again_and_replaced(tmp_path: Path, damage: str) -> None:
    source = tmp_path / "kallsyms"
    source.write_text(SAMPLE)
    Kallsyms.load(str(source), stored=_store(tmp_path / "store"))
    (entry,) = (tmp_path / "store").iterdir()
    if damage == "flipped name byte":  # the checksum no longer holds
        data = entry.read_bytes()
        entry.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
    else:  # a well-formed entry, checksum and all, whose header does not describe its columns
        header, payload = _store(tmp_path / "store").read(entry.name)
        _store(tmp_path / "store").write(entry.name, {**header, "count": header["count"] + 1}, payload)
    store = _store(tmp_path / "store")
    table = Kallsyms.load(str(source), stored=store)
    assert store.stats["bad"] == 1 and store.stats["writes"] == 1 and _same_table(table, Kallsyms.load(str(source)))
    later = _store(tmp_path / "store")
    Kallsyms.load(str(source), stored=later)
    assert later.stats["hits"] == 1


def test_hidden_symbols_are_not_stored(tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text("".join("0000000000000000" + line[16:] + "\n" for line in SAMPLE.splitlines()))
    store = _store(tmp_path / "store")
    with pytest.raises(OptraceError, match="hidden"):
        Kallsyms.load(str(tmp_path / "kallsyms"), stored=store)
    assert list((tmp_path / "store").iterdir()) == [] and store.stats["writes"] == 0


def test_the_loader_thread_stores_the_real_table(tmp_path: Path, monkeypatch) -> None:
    """What a session starts: a second loader reads back the table the first one parsed."""
    from optrace.frontend import session

    if os.geteuid() != 0:
        pytest.skip("/proc/kallsyms shows addresses to root only")
    monkeypatch.setenv("OPTRACE_CACHE_DIR", str(tmp_path))
    copy = tmp_path / "kallsyms.txt"  # one text for both: BPF programs come and go between reads
    copy.write_bytes(Path("/proc/kallsyms").read_bytes())
    monkeypatch.setattr(Kallsyms.load.__func__, "__defaults__", (str(copy), None))
    tables = []
    for _ in range(2):
        loader = session.KernelSymbolsLoader()
        loader.hand_to(type("Symbolizer", (), {"use_kernel_symbols": lambda self, table: tables.append(table)})())
    assert len(list((tmp_path / "kallsyms").iterdir())) == 1
    assert len(tables) == 2 and len(tables[0]) > 10000 and _same_table(*tables)


def naive_table(text: str) -> tuple[list[int], list[tuple[str, str | None]]]:
    """The plain reading of /proc/kallsyms the compact table must answer like: text symbols, per
    address the alias with fewest leading underscores, then the longest name, then the first seen."""
    best: dict[int, tuple[str, str | None]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[1] not in ("t", "T", "w", "W"):
            continue
        symbol = (fields[2], fields[3].strip("[]") if len(fields) > 3 else None)
        kept = best.get(int(fields[0], 16))
        rank = lambda name: (-(len(name) - len(name.lstrip("_"))), len(name))  # noqa: E731
        if kept is None or rank(symbol[0]) > rank(kept[0]):
            best[int(fields[0], 16)] = symbol
    addresses = sorted(best)
    return addresses, [best[address] for address in addresses]


def naive_find(table: tuple[list[int], list[tuple[str, str | None]]], address: int) -> tuple[str, str | None] | None:
    index = bisect.bisect_right(table[0], address) - 1
    return table[1][index] if index >= 0 else None


def test_aliases_keep_the_preferred_name_whatever_the_line_order(tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text(
        "ffffffff81000100 T __x64_sys_read\nffffffff81000100 T ksys_read_long\n"
        "ffffffff81000100 t ksys_read_lon2\nffffffff81000000 T b\nffffffff81000000 T a\n"
        "ffffffffc0000000 t one\t[mod_a]\nffffffffc0000000 t two\t[mod_b]\n")
    kallsyms = Kallsyms.load(str(tmp_path / "kallsyms"))
    assert len(kallsyms) == 3
    assert kallsyms.find(0xFFFFFFFF81000100).name == "ksys_read_long"  # no underscores, longest, first
    assert kallsyms.find(0xFFFFFFFF810000FF).name == "b"
    assert (kallsyms.find(0xFFFFFFFFC0000001).name, kallsyms.find(0xFFFFFFFFC0000001).module) == ("one", "mod_a")


def test_compact_table_answers_like_a_naive_one_on_the_real_kallsyms(tmp_path: Path, bpf_ready) -> None:
    """With a BPF program of its own loaded: this kernel has no loadable modules, so JITed BPF programs
    (``[bpf]``) are its only module symbols, and none may be loaded when the test runs alone."""
    from bcc import BPF

    program = BPF(text=b"int kallsyms_probe(void *ctx) { return 0; }")
    program.load_func(b"kallsyms_probe", BPF.SOCKET_FILTER)
    text = Path("/proc/kallsyms").read_text()  # one copy: BPF programs come and go between reads
    program.cleanup()
    (tmp_path / "kallsyms").write_text(text)
    compact = Kallsyms.load(str(tmp_path / "kallsyms"))
    naive = naive_table(text)
    assert len(compact) == len(naive[0]) > 10000
    rng = random.Random(5)
    starts = naive[0]
    probes = [starts[0] - 1, starts[-1] + (1 << 20)]
    probes += [starts[i] + delta for i in range(0, len(starts), 7) for delta in (-1, 0, 1)]
    probes += [rng.randrange(starts[0], starts[-1]) for _ in range(50000)]
    mismatches = []
    for address in probes:
        found = compact.find(address)
        if (found and (found.name, found.module)) != naive_find(naive, address):
            mismatches.append(hex(address))
    assert mismatches == []
    assert any(compact.find(address).module == "bpf" for address in starts[-100:])  # our program at least


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.from_regex(rb"_{0,3}[a-c]{1,3}", fullmatch=True),
                          st.sampled_from([None, "ext4", "xfs"])), max_size=60))
def test_one_symbol_per_address_the_preferred_alias_first_in_file_order(rows) -> None:
    """Against the rule written plainly: per address, the alias with the fewest leading underscores, then
    the longest name, the first in file order among equals; addresses sorted; modules kept."""
    table = Kallsyms((address, KernelSymbol(name.decode(), module)) for address, name, module in rows)
    expected = {}
    for address, name, module in rows:
        if address not in expected or name_preference(name) > name_preference(expected[address][0]):
            expected[address] = (name, module)
    assert list(table._addresses) == sorted(expected)
    for address, (name, module) in expected.items():
        assert table.find(address) == KernelSymbol(name.decode(), module)
