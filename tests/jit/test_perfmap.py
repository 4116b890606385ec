"""perf-map reader: formats, incremental reads, bad lines, and property tests (never a hang or a crash)."""
from __future__ import annotations

import os

from hypothesis import given, settings, strategies as st

from optrace.jitmaps.perfmap import PerfMapEntry, PerfMapReader, parse_line, read_perf_map


def write(path, data: bytes, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def read_all(reader: PerfMapReader, path, final=False) -> list[PerfMapEntry]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(reader.read_new(fd, final))
    finally:
        os.close(fd)


def test_formats_with_and_without_0x_and_names_with_spaces():
    assert parse_line(b"7f00 10 foo") == PerfMapEntry(0x7F00, 0x10, "foo")
    assert parse_line(b"0x00007f4f38ec7600 0x00000000000000d8 long Hot.f(long)") == \
        PerfMapEntry(0x7F4F38EC7600, 0xD8, "long Hot.f(long)")
    assert parse_line(b"7f00  10\tLazyCompile:~hot /tmp/a b.js:3\r") == \
        PerfMapEntry(0x7F00, 0x10, "LazyCompile:~hot /tmp/a b.js:3")


def test_bad_lines_are_rejected():
    for line in [b"", b"7f00", b"7f00 10", b"xyz 10 foo", b"7f00 zz foo", b"7f00 0 empty",
                 b"-7f00 10 neg", b"7_f00 10 underscore", b"ffffffffffffffff 10 wraps"]:
        assert parse_line(line) is None, line


def test_incremental_reads_parse_only_new_complete_lines(tmp_path):
    path = tmp_path / "perf-1.map"
    write(path, b"1000 10 a\n2000 10 b\n3000 1")
    reader = PerfMapReader()
    assert [e.name for e in read_all(reader, path)] == ["a", "b"]
    assert reader.offset == len(b"1000 10 a\n2000 10 b\n")
    write(path, b"0 c d\n4000 10 e", "ab")
    assert [e.name for e in read_all(reader, path)] == ["c d"]
    assert read_all(reader, path) == []
    assert [e.name for e in read_all(reader, path, final=True)] == ["e"]  # last line without newline
    assert reader.lines == 4 and reader.bad_lines == 0


def test_bad_lines_skipped_and_counted(tmp_path):
    path = tmp_path / "perf-1.map"
    write(path, b"1000 10 good\nnot a line\n\n2000 zz bad\n3000 10 also good\n")
    fd = os.open(path, os.O_RDONLY)
    entries, reader = read_perf_map(fd)
    os.close(fd)
    assert [e.name for e in entries] == ["good", "also good"]
    assert (reader.lines, reader.bad_lines) == (4, 2)


def test_rewritten_file_is_read_again_from_the_start(tmp_path):
    """`jcmd PID Compiler.perfmap` rewrites the map: a shorter file means start over."""
    path = tmp_path / "perf-1.map"
    write(path, b"1000 10 old\n2000 10 old2\n")
    reader = PerfMapReader()
    read_all(reader, path)
    write(path, b"1000 10 new\n")
    assert [e.name for e in read_all(reader, path)] == ["new"]
    assert reader.restarts == 1


def test_lines_longer_than_a_chunk(tmp_path, monkeypatch):
    import optrace.jitmaps.perfmap as perfmap
    monkeypatch.setattr(perfmap, "CHUNK", 7)
    path = tmp_path / "perf-1.map"
    write(path, b"1000 10 a_rather_long_name\n2000 10 b\n")
    assert [e.name for e in read_all(PerfMapReader(), path)] == ["a_rather_long_name", "b"]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2000), st.integers(min_value=0, max_value=2000))
def test_random_bytes_never_crash_and_split_reads_agree(tmp_path_factory, data, cut):
    """Any input: no exception, and reading in two steps gives what one final read gives."""
    path = tmp_path_factory.mktemp("pm") / "perf-1.map"
    write(path, data)
    whole = read_all(PerfMapReader(), path, final=True)
    write(path, data[:cut])
    reader = PerfMapReader()
    first = read_all(reader, path)
    write(path, data[cut:], "ab")
    assert first + read_all(reader, path, final=True) == whole


names = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1,
                max_size=40).map(str.strip).filter(bool)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**47), st.integers(1, 2**20), names, st.booleans()), max_size=50))
def test_written_entries_read_back(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("pm") / "perf-1.map"
    text = "".join(f"{'0x' if hexp else ''}{s:x} {'0x' if hexp else ''}{n:x} {name}\n" for s, n, name, hexp in rows)
    write(path, text.encode())
    assert read_all(PerfMapReader(), path) == [PerfMapEntry(s, n, name) for s, n, name, _ in rows]


def test_a_read_budget_splits_a_big_map_without_losing_or_repeating_a_line(tmp_path):
    """serve reads a huge map over several drains: every call stops after its budget and the next goes on
    from there; together they give exactly what one read gives."""
    path = tmp_path / "perf-1.map"
    with open(path, "w") as f:
        for i in range(200_000):
            f.write(f"{0x1000 + i * 16:x} 10 name_{i}_{'x' * 30}\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        whole = list(PerfMapReader().read_new(fd, final=True))
        reader, parts, calls = PerfMapReader(), [], 0
        while reader.offset < os.path.getsize(path):
            parts += list(reader.read_new(fd, final=True, budget=1))
            calls += 1
    finally:
        os.close(fd)
    assert parts == whole and len(whole) == 200_000
    assert calls >= 2


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000), st.integers(min_value=1, max_value=64))
def test_parsing_a_piece_at_a_time_changes_nothing(tmp_path_factory, data, piece):
    """Blocks are parsed in pieces cut at line ends (bounded temporary objects): any piece size gives the
    same entries and the same line counts (long lines too) as one piece."""
    from unittest import mock

    import optrace.jitmaps.perfmap as perfmap

    path = tmp_path_factory.mktemp("pm") / "perf-1.map"
    write(path, data.replace(b"\0", b"\n"))
    results = []
    for size in (1 << 30, piece):
        with mock.patch.object(perfmap, "PIECE", size), mock.patch.object(perfmap, "MAX_LINE", 40):
            reader = PerfMapReader()
            results.append((read_all(reader, path, final=True), reader.lines, reader.bad_lines, reader.long_lines))
    assert results[0] == results[1]


map_line = st.one_of(
    st.builds(lambda start, size, name, blank: b"%s%x %x %s" % (blank, start, size, name),
              st.integers(0, 1 << 48), st.integers(1, 1 << 20),
              st.binary(min_size=1, max_size=30).map(lambda b: b.replace(b"\n", b"_")),
              st.sampled_from([b"", b" ", b"\t "])),
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ")))


@settings(max_examples=150, deadline=None)
@given(st.lists(map_line, max_size=60), st.integers(min_value=1, max_value=64),
       st.integers(min_value=1, max_value=400), st.booleans())
def test_a_line_offset_reads_back_its_entry(tmp_path_factory, lines, piece, budget, last_newline):
    """A reader ``with_offsets`` (serve keeps names in the file) gives the same entries, read in any
    pieces and budgets, and each offset is that of a line that parses back to the entry."""
    from unittest import mock

    import optrace.jitmaps.perfmap as perfmap

    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    path = tmp_path_factory.mktemp("pm") / "perf-1.map"
    write(path, data)
    with mock.patch.object(perfmap, "PIECE", piece), mock.patch.object(perfmap, "MAX_LINE", 40):
        plain = read_all(PerfMapReader(), path, final=True)
        reader = PerfMapReader(with_offsets=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            found = []
            while reader.offset < len(data):
                before = reader.offset
                found += reader.read_new(fd, final=True, budget=budget)
                assert reader.offset > before
        finally:
            os.close(fd)
        assert [entry[:3] for entry in found] == [entry[:3] for entry in plain]
        for entry in found:
            if entry.line_offset is not None:
                line = data[entry.line_offset:].split(b"\n", 1)[0]
                assert (parse_line(line) or ())[:3] == entry[:3]
        if b"\n" not in data or max(map(len, data.split(b"\n"))) <= 40:
            assert all(entry.line_offset is not None for entry in found)
