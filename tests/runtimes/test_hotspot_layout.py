"""HotSpot layouts taken from the VM's own tables (frontend/runtimes/hotspot/layout.py), and refused, never
guessed, when something is missing or unknown; the compressed streams and names the naming reads. The tables
are those stored with the Java replay snapshots (tests/replay/snapshots: JDK 17 and 25): no JVM runs here."""
from __future__ import annotations

import dataclasses

import pytest

from javasnapshots import load_java, process_of
from optrace.frontend.runtimes.hotspot.layout import hotspot_layout
from optrace.frontend.runtimes.hotspot.methods import java_class_name
from optrace.frontend.runtimes.hotspot.unsigned5 import Stream, line_of, line_table

VERSIONS = {"java-17": 17, "java-25": 25}


def structs_of(name: str):
    return process_of(load_java(name)).structs


@pytest.mark.parametrize("name", VERSIONS)
def test_both_jdks_layouts_are_taken_from_their_tables(name):
    layout = hotspot_layout(structs_of(name), VERSIONS[name])
    assert not isinstance(layout, str), layout
    assert layout.nmethod_shape == {"java-17": "CompiledMethod (JDK 9-21)",
                                    "java-25": "immutable and mutable data (JDK 25+)"}[name]
    assert (layout.blob_kind is None) == (name == "java-17")  # JDK 23+ say a blob's kind


@pytest.mark.parametrize("name", VERSIONS)
@pytest.mark.parametrize("missing", ["CodeBlob::_frame_size", "PcDesc::_scope_decode_offset", "Symbol::_length",
                                     "Method::_constMethod"])
def test_a_missing_field_is_refused_by_name(name, missing):
    structs = structs_of(name)
    offsets = {k: v for k, v in structs.offsets.items() if k != missing}
    assert hotspot_layout(dataclasses.replace(structs, offsets=offsets), VERSIONS[name]) == \
        f"unknown layout: no {missing}"


@pytest.mark.parametrize("name", VERSIONS)
def test_an_unknown_field_type_is_refused(name):
    structs = structs_of(name)
    types = {**structs.types, "CodeBlob::_frame_size": "float"}
    assert hotspot_layout(dataclasses.replace(structs, types=types), VERSIONS[name]) == \
        "unknown type 'float' of CodeBlob::_frame_size"


@pytest.mark.parametrize("name", VERSIONS)
def test_another_interpreter_frame_layout_is_refused(name):
    structs = structs_of(name)
    ints = {**structs.ints, "frame::interpreter_frame_last_sp_offset": -3}
    found = hotspot_layout(dataclasses.replace(structs, ints=ints), VERSIONS[name])
    assert found.startswith("unknown interpreter frame layout")


def test_a_jdk_whose_nmethods_keep_debug_information_elsewhere_is_refused():
    """JDK 22-24 moved it between the two shapes known here: such a VM is refused, not read as one of them."""
    structs = structs_of("java-25")
    offsets = {k: v for k, v in structs.offsets.items() if k != "CodeBlob::_mutable_data"}
    assert hotspot_layout(dataclasses.replace(structs, offsets=offsets), 24) == \
        "unknown layout: no known shape of nmethod debug information"


def test_jdk_8_is_refused():
    assert hotspot_layout(structs_of("java-17"), 8) == "JDK 8 not supported"


@pytest.mark.parametrize(("data", "excluded", "value"), [
    (bytes([5]), 0, 5), (bytes([191]), 0, 191), (bytes([192, 1]), 0, 192 + 64), (bytes([200, 3]), 0, 200 + 3 * 64),
    (bytes([6]), 1, 5), (bytes([193, 2]), 1, 192 + 64),  # JDK 20+: every byte one higher, none zero
])
def test_unsigned5(data, excluded, value):
    assert Stream(data, excluded).uint() == value


def test_unsigned5_refuses_an_excluded_byte_and_a_cut_stream():
    assert Stream(bytes([0]), 1).uint() is None
    assert Stream(bytes([250]), 0).uint() is None
    assert Stream(bytes([255] * 9), 0).uint() is not None  # at most five bytes are read


def test_line_table():
    # (bci 0, line 10) escaped, then +3 bci +1 line, +5 bci +2 line; then the end
    zigzag = lambda v: (v << 1) ^ (v >> 31)  # noqa: E731
    data = bytes([0xFF, zigzag(0), zigzag(10), (3 << 3) | 1, (5 << 3) | 2, 0, 0xAA])
    table = line_table(data, 0)
    assert table == ((0, 10), (3, 11), (8, 13))
    assert [line_of(table, bci) for bci in (0, 2, 3, 7, 8, 100)] == [10, 10, 11, 11, 13, 13]


@pytest.mark.parametrize(("internal", "shown"), [
    ("java/util/TimSort", "java.util.TimSort"),
    ("Phases$$Lambda/0x0000000801000a00", "Phases$$Lambda"),  # JDK 21+ hidden classes
    ("Phases$$Lambda$1+0x00007fb620000a08", "Phases$$Lambda$1"),  # JDK 17's
    ("pkg/Outer$Inner", "pkg.Outer$Inner"),
])
def test_java_class_names(internal, shown):
    assert java_class_name(internal) == shown


@pytest.mark.parametrize("name", VERSIONS)
def test_implausible_sizes_are_refused(name):
    """The tables are the process's memory: a structure said to be huge is not read, the VM is refused."""
    structs = structs_of(name)
    sizes = {**structs.sizes, "nmethod": 1 << 30}
    assert hotspot_layout(dataclasses.replace(structs, sizes=sizes), VERSIONS[name]) == "implausible layout: nmethod"
    offsets = {**structs.offsets, "CodeBlob::_frame_size": 1 << 40}
    assert hotspot_layout(dataclasses.replace(structs, offsets=offsets), VERSIONS[name]) == \
        "implausible layout: blob_frame_size"
