"""The record file: round trip, atomic replacement, ownership under sudo, and every kind of bad input."""
from __future__ import annotations

import dataclasses
import json
import os
import stat
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optrace import recordfile
from optrace.model import Record
from optrace.outputfile import output_mode
from optrace.recordfile import HEADER, MAGIC, RecordFileError, read_record, write_record
from optrace.schema import encode, encode_record

ROOT = os.geteuid() == 0


def packed(payload: bytes, version: int = 1, raw_len: int | None = None, crc: int | None = None) -> bytes:
    """A file with a correct header around any payload (so validation past the checksum is reached)."""
    compressed = zlib.compress(payload)
    header = HEADER.pack(MAGIC, version, zlib.crc32(compressed) if crc is None else crc, len(compressed),
                         len(payload) if raw_len is None else raw_len)
    return header + compressed


def valid_bytes(record: Record) -> bytes:
    """The bytes `record` writes."""
    return recordfile._serialize(record)


def test_round_trip_keeps_every_field(tmp_path: Path, record: Record) -> None:
    record.frames[5] = dataclasses.replace(record.frames[5], build_id="abcdef")
    write_record(record, tmp_path / "r.data")
    assert read_record(tmp_path / "r.data") == record


def test_file_starts_with_magic_and_version(tmp_path: Path, record: Record) -> None:
    write_record(record, tmp_path / "r.data")
    magic, version, *_ = HEADER.unpack((tmp_path / "r.data").read_bytes()[: HEADER.size])
    assert (magic, version) == (b"OPTRDATA", 4)


def test_rewrite_keeps_previous_as_old(tmp_path: Path, record: Record) -> None:
    path = tmp_path / "r.data"
    write_record(record, path)
    first = path.read_bytes()
    record.meta.hostname = "second"
    write_record(record, path)
    assert (tmp_path / "r.data.old").read_bytes() == first
    assert read_record(path).meta.hostname == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.data", "r.data.old"]


def test_failing_write_leaves_old_file_and_no_temp(tmp_path: Path, record: Record, monkeypatch) -> None:
    path = tmp_path / "r.data"
    write_record(record, path)
    before = path.read_bytes()

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(recordfile.os, "fsync", broken_fsync)
    with pytest.raises(RecordFileError, match=r"cannot write .*r\.data: Input/output error"):
        write_record(record, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.data"]


@pytest.mark.skipif(not ROOT, reason="mounting a tiny tmpfs needs root")
def test_full_disk_leaves_old_file_and_no_temp(tmp_path: Path, record: Record) -> None:
    """A real ENOSPC: a 64 KiB tmpfs, an old small record, then a big record that cannot fit."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        path = mount / "r.data"
        write_record(record, path)
        before = path.read_bytes()
        big = dataclasses.replace(record, frames=record.frames + [
            dataclasses.replace(record.frames[0], symbol=os.urandom(32).hex()) for _ in range(4000)])
        with pytest.raises(RecordFileError, match="No space left on device"):
            write_record(big, path)
        assert path.read_bytes() == before
        assert [p.name for p in mount.iterdir()] == ["r.data"]
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.skipif(not ROOT, reason="chown needs root")
def test_owned_by_sudo_user(tmp_path: Path, record: Record, monkeypatch) -> None:
    """Issue 40: under sudo the record is the invoking user's, 0600 (report needs no root for it)."""
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65533")
    write_record(record, tmp_path / "r.data")
    info = os.stat(tmp_path / "r.data")
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (65534, 65533, 0o600)


@pytest.mark.skipif(not ROOT, reason="needs root")
@pytest.mark.parametrize("umask, mode", [(0o022, 0o600), (0o000, 0o600), (0o277, 0o400)])
def test_owned_by_root_without_sudo_and_readable_only_by_root(tmp_path: Path, record: Record, monkeypatch,
                                                               umask: int, mode: int) -> None:
    """Issue 40: root's record holds every user's source lines and command lines: 0600 whatever the umask
    lets through (it was 0666 & ~umask: 0644)."""
    monkeypatch.delenv("SUDO_UID", raising=False)
    monkeypatch.delenv("SUDO_GID", raising=False)
    old = os.umask(umask)
    try:
        write_record(record, tmp_path / "r.data")
    finally:
        os.umask(old)
    info = os.stat(tmp_path / "r.data")
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, mode)


def test_mode_follows_the_umask_when_not_root(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    old = os.umask(0o027)
    try:
        assert output_mode() == 0o640
    finally:
        os.umask(old)


def test_write_into_missing_directory(tmp_path: Path, record: Record) -> None:
    with pytest.raises(RecordFileError, match=r"cannot write .*: No such file or directory"):
        write_record(record, tmp_path / "nope" / "r.data")


def test_symlink_at_final_name_is_replaced_not_followed(tmp_path: Path, record: Record) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "r.data").symlink_to(victim)
    write_record(record, tmp_path / "r.data")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "r.data").is_symlink()


BAD_FILES = {
    "empty": (b"", "is empty: record it again"),
    "perf": (b"PERFILE2" + bytes(200), "is a perf.data file: use perf report"),
    "foreign": (b"\x7fELF\x02\x01\x01" + bytes(100), "is not an optrace record file"),
    "text": (b"hello world\n", "is not an optrace record file"),
    "short magic": (b"OPTR", "is truncated"),
    "short header": (MAGIC + b"\x01\x00", "is truncated"),
    "newer": (packed(b"{}", version=7), r"recorded by a newer optrace \(format 7\): upgrade"),
    "version 0": (packed(b"{}", version=0), r"corrupt \(format version 0\)"),
    "checksum": (packed(b"{}", crc=1), r"corrupt \(checksum mismatch\)"),
    "trailing": (packed(b"{}") + b"x", r"corrupt \(trailing data"),
    "bomb": (packed(b"[" * 100 + b"]" * 100, raw_len=10), r"corrupt \(payload size mismatch\)"),
    "over cap": (packed(b"{}", raw_len=1 << 40), r"corrupt or from too long a run \(a payload larger than 256 MiB\)"),
    "not json": (packed(b"\xff\xfe"), r"corrupt \(bad JSON"),
    "deep json": (packed(b"[" * 100000 + b"]" * 100000), r"corrupt \("),
    "wrong shape": (packed(b"[1, 2]"), r"corrupt \(record: expected dict, got list\)"),
    "missing meta": (packed(b'{"frames": []}'), r"corrupt \(record: missing field 'meta'\)"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_files_give_one_line_errors(tmp_path: Path, name: str) -> None:
    content, message = BAD_FILES[name]
    path = tmp_path / "bad.data"
    path.write_bytes(content)
    with pytest.raises(RecordFileError, match=message) as info:
        read_record(path)
    assert "\n" not in str(info.value)


def test_schema_errors_name_the_field(tmp_path: Path, record: Record) -> None:
    doc = encode(record)
    doc["samples"][2]["count"] = "many"
    (tmp_path / "a").write_bytes(packed(json.dumps(doc).encode()))
    with pytest.raises(RecordFileError, match=r"record\.samples\[2\]\.count: expected int, got str"):
        read_record(tmp_path / "a")
    doc = encode(record)
    doc["samples"][0]["frames"] = [0, 99]
    (tmp_path / "b").write_bytes(packed(json.dumps(doc).encode()))
    with pytest.raises(RecordFileError, match=r"samples\[0\]: frame index out of range"):
        read_record(tmp_path / "b")


def test_missing_directory_fifo_and_truncated_payload(tmp_path: Path, record: Record) -> None:
    with pytest.raises(RecordFileError, match="no such file: .*; record one with optrace record"):
        read_record(tmp_path / "missing.data")
    with pytest.raises(RecordFileError, match="is a directory"):
        read_record(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # opening a FIFO for reading would block without a writer
    with pytest.raises(RecordFileError, match="is not a regular file"):
        read_record(tmp_path / "fifo")
    whole = valid_bytes(record)
    (tmp_path / "cut").write_bytes(whole[:-10])
    with pytest.raises(RecordFileError, match="is truncated"):
        read_record(tmp_path / "cut")


def test_path_with_newline_stays_one_line(tmp_path: Path) -> None:
    with pytest.raises(RecordFileError) as info:
        read_record(tmp_path / "a\nb")
    assert "\n" not in str(info.value)


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def read_bytes_only_record_file_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "p.data"
    path.write_bytes(content)
    try:
        read_record(path)
    except RecordFileError as exc:
        assert "\n" not in str(exc)


@PROPERTY
@given(content=st.binary(max_size=300))
def test_random_bytes(tmp_path: Path, content: bytes) -> None:
    read_bytes_only_record_file_error(tmp_path, content)


@PROPERTY
@given(content=st.binary(max_size=300))
def test_random_bytes_after_the_magic(tmp_path: Path, content: bytes) -> None:
    read_bytes_only_record_file_error(tmp_path, MAGIC + content)


@PROPERTY
@given(data=st.data())
def test_truncations_of_a_valid_file(tmp_path: Path, record: Record, data) -> None:
    whole = valid_bytes(record)
    cut = data.draw(st.integers(min_value=0, max_value=len(whole) - 1))
    (tmp_path / "p.data").write_bytes(whole[:cut])
    with pytest.raises(RecordFileError, match="truncated|empty"):
        read_record(tmp_path / "p.data")


@PROPERTY
@given(data=st.data())
def test_bit_flips_of_a_valid_file(tmp_path: Path, record: Record, data) -> None:
    whole = bytearray(valid_bytes(record))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        bit = data.draw(st.integers(min_value=0, max_value=len(whole) * 8 - 1))
        whole[bit // 8] ^= 1 << (bit % 8)
    read_bytes_only_record_file_error(tmp_path, bytes(whole))


@PROPERTY
@given(payload=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                            lambda children: st.lists(children, max_size=4)
                            | st.dictionaries(st.sampled_from(["meta", "frames", "samples", "calls", "pid",
                                                               "count", "symbol"]), children, max_size=4),
                            max_leaves=20))
def test_random_json_with_a_valid_header(tmp_path: Path, payload) -> None:
    """Past the checksum, the schema check is the only guard: random JSON must still be refused cleanly."""
    read_bytes_only_record_file_error(tmp_path, packed(json.dumps(payload).encode()))


def test_header_layout_is_32_bytes() -> None:
    assert HEADER.size == 32 == struct.calcsize("<8sIIQQ")


SCALARS = {int, float, str, bool, bytes, type(None)}


def supported(hint) -> bool:
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # X | None only: the decoder consumes what it reads
        args = typing.get_args(hint)
        return len(args) == 2 and type(None) in args and all(supported(arg) for arg in args)
    if origin in (list, tuple, dict):
        return all(arg is Ellipsis or supported(arg) for arg in typing.get_args(hint))
    return hint in SCALARS or dataclasses.is_dataclass(hint)


def stored_classes(cls: type, found: set[type] | None = None) -> set[type]:
    """``cls`` and every dataclass its fields hold, at any depth: what a record file stores."""
    import typing

    found = set() if found is None else found
    found.add(cls)
    pending = list(typing.get_type_hints(cls).values())
    while pending:
        hint = pending.pop()
        if dataclasses.is_dataclass(hint) and hint not in found:
            stored_classes(hint, found)
        pending += [arg for arg in typing.get_args(hint) if arg is not Ellipsis]
    return found


def test_every_model_field_has_a_type_the_file_can_hold() -> None:
    """A field added to a class a record holds, with say a Path or set type, would break the file: fail here
    first. (RawSample, the drains' own record, is never written: its frames are named tuples.)"""
    import typing

    from optrace import model

    classes = stored_classes(model.Record)
    assert {model.RecordMeta, model.Frame, model.Sample, model.CallCount} <= classes
    for cls in classes:
        for name, hint in typing.get_type_hints(cls).items():
            assert supported(hint), f"{cls.__name__}.{name}: {hint} cannot be stored in a record file"


def test_write_over_a_directory_is_one_error(tmp_path: Path, record: Record) -> None:
    (tmp_path / "r.data").mkdir()
    with pytest.raises(RecordFileError, match=r"cannot write .*r\.data: Is a directory"):
        write_record(record, tmp_path / "r.data")
    assert [p.name for p in tmp_path.iterdir()] == ["r.data"]


@pytest.mark.skipif(not ROOT, reason="mknod needs root")
def test_write_over_a_device_is_refused_but_the_null_device_is_written_to(tmp_path: Path, record: Record) -> None:
    """`record -o /dev/null` as root writes into the null device and never replaces it with a regular file;
    any other device is refused."""
    null, zero = tmp_path / "null", tmp_path / "zero"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(zero, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    write_record(record, null)
    assert stat.S_ISCHR(null.lstat().st_mode)
    with pytest.raises(RecordFileError, match=r"cannot write .*zero: not a regular file"):
        write_record(record, zero)
    assert stat.S_ISCHR(zero.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "zero"]


def test_the_json_written_a_piece_at_a_time_is_the_whole_documents(record: Record, monkeypatch) -> None:
    """Lists and tables' columns are encoded and compressed a chunk at a time (peak memory): the payload is
    still exactly json.dumps of the encoded record, whatever the chunk size against the lists' lengths."""
    for chunk in (1, 2, 3, 1000):
        monkeypatch.setattr(recordfile, "SERIALIZE_CHUNK", chunk)
        data = recordfile._serialize(record)
        _, _, crc, compressed_len, payload_len = HEADER.unpack(data[:HEADER.size])
        payload = zlib.decompress(data[HEADER.size:])
        assert payload == json.dumps(encode_record(record), separators=(",", ":")).encode()
        assert (len(payload), compressed_len, crc) == (payload_len, len(data) - HEADER.size,
                                                       zlib.crc32(data[HEADER.size:]))
