"""Reading OTLP profiles requests as a receiver would, with the published messages only (not the product's
encoder): the dictionary checked against the protocol's rules, each profile's samples as named stacks.

Importable by name (pytest's pythonpath includes tests/), shared by the report, serve and fleet tests.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class DecodedFrame:
    name: str | None  # the Line's function (the innermost one), None when the location has no Line
    filename: str
    start_line: int
    line: int
    mapping: str  # the mapping's file name, "" for none
    build_id: str
    address: int
    frame_type: str | None


@dataclass
class DecodedSample:
    stack: tuple[DecodedFrame, ...]  # leaf first
    value: int
    attributes: dict[str, object]


@dataclass
class DecodedProfile:
    resource: dict[str, object]
    scope: tuple[str, str]
    sample_type: tuple[str, str]
    period_type: tuple[str, str]
    period: int
    time_unix_nano: int
    duration_nano: int
    profile_id: bytes
    samples: list[DecodedSample] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(sample.value for sample in self.samples)

    def leaves(self) -> Counter[str]:
        """Value by the leaf frame's function name."""
        totals: Counter[str] = Counter()
        for sample in self.samples:
            totals[str(sample.stack[0].name) if sample.stack else ""] += sample.value
        return totals

    def inclusive(self) -> Counter[str]:
        """Value by every function a stack passes through (once per stack)."""
        totals: Counter[str] = Counter()
        for sample in self.samples:
            for name in {frame.name for frame in sample.stack if frame.name}:
                totals[name] += sample.value
        return totals


def plain(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def check_dictionary(request: ExportProfilesServiceRequest) -> None:
    """The dictionary rules of profiles.proto: each table's entry 0 is its zero value, every index points
    into its table, and no string, function, mapping, stack or attribute is there twice."""
    d = request.dictionary
    assert d.string_table[0] == ""
    for table in (d.mapping_table, d.location_table, d.function_table, d.link_table, d.attribute_table, d.stack_table):
        assert len(table) >= 1 and table[0].ByteSize() == 0, table
    strings = len(d.string_table)
    assert len(set(d.string_table)) == strings
    for table in (d.function_table, d.mapping_table, d.stack_table, d.attribute_table, d.location_table):
        serialized = [entry.SerializeToString(deterministic=True) for entry in table]
        assert len(set(serialized)) == len(serialized), "a dictionary entry is there twice"
    for function in d.function_table:
        assert max(function.name_strindex, function.system_name_strindex, function.filename_strindex) < strings
    for mapping in d.mapping_table:
        assert mapping.filename_strindex < strings and all(0 < i < len(d.attribute_table) for i in mapping.attribute_indices)
    for location in d.location_table:
        assert location.mapping_index < len(d.mapping_table)
        assert all(0 < line.function_index < len(d.function_table) for line in location.lines)
        assert all(0 < i < len(d.attribute_table) for i in location.attribute_indices)
    for stack in d.stack_table[1:]:
        assert stack.location_indices and all(0 < i < len(d.location_table) for i in stack.location_indices)
    for attribute in d.attribute_table[1:]:
        assert 0 < attribute.key_strindex < strings


def decode(request: ExportProfilesServiceRequest, check: bool = True) -> list[DecodedProfile]:
    if check:
        check_dictionary(request)
    d = request.dictionary
    s = d.string_table

    def attributes(indices) -> dict[str, object]:
        return {s[d.attribute_table[i].key_strindex]: plain(d.attribute_table[i].value) for i in indices}

    frames: dict[int, DecodedFrame] = {}

    def frame(index: int) -> DecodedFrame:
        if index not in frames:
            location = d.location_table[index]
            mapping = d.mapping_table[location.mapping_index]
            line = location.lines[0] if location.lines else None
            function = d.function_table[line.function_index] if line else None
            frames[index] = DecodedFrame(
                name=s[function.name_strindex] if function else None,
                filename=s[function.filename_strindex] if function else "",
                start_line=function.start_line if function else 0, line=line.line if line else 0,
                mapping=s[mapping.filename_strindex],
                build_id=str(attributes(mapping.attribute_indices).get("process.executable.build_id.gnu", "")),
                address=location.address, frame_type=attributes(location.attribute_indices).get("profile.frame.type"))
        return frames[index]

    found = []
    for resource_profiles in request.resource_profiles:
        resource = {kv.key: plain(kv.value) for kv in resource_profiles.resource.attributes}
        for scope_profiles in resource_profiles.scope_profiles:
            scope = (scope_profiles.scope.name, scope_profiles.scope.version)
            for profile in scope_profiles.profiles:
                decoded = DecodedProfile(
                    resource, scope, (s[profile.sample_type.type_strindex], s[profile.sample_type.unit_strindex]),
                    (s[profile.period_type.type_strindex], s[profile.period_type.unit_strindex]), profile.period,
                    profile.time_unix_nano, profile.duration_nano, profile.profile_id)
                for sample in profile.samples:
                    assert len(sample.values) == 1 and not sample.timestamps_unix_nano
                    stack = d.stack_table[sample.stack_index]
                    decoded.samples.append(DecodedSample(tuple(frame(i) for i in stack.location_indices),
                                                         sample.values[0], attributes(sample.attribute_indices)))
                found.append(decoded)
    return found
