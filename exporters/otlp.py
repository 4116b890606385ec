"""`--format otlp`: an OTLP ``ExportProfilesServiceRequest`` (protobuf), the message `optrace serve`
pushes to an OpenTelemetry Collector or Pyroscope (frontend/serve/otlpexport.py), written to a file for
offline use (`report --format otlp -o FILE`).

Built with the published messages (``opentelemetry-proto``, ``profiles.v1development``, pinned in
pyproject.toml), filled as the OpenTelemetry eBPF profiler fills them:

- one ``ResourceProfiles`` per process: the host's attributes, the process's (``process.pid``,
  ``process.executable.*``, ``process.command_line``, ``container.id``: semantic conventions 1.37) and
  ``service.name`` (given, else ``unknown_service:<executable name>`` as the SDKs default it); one
  ``ScopeProfiles`` (optrace and its version) with one ``Profile`` per event, since a profile has one
  sample type in this version of the protocol:

  - CPU samples: sample type ``samples``/``count``, period type ``cpu``/``nanoseconds``, period one
    sampling interval (1e9 / F), as the OTel profiler reports on-CPU samples;
  - off-CPU time: ``off_cpu``/``nanoseconds``, each value the time a stack waited (the OTel profiler's
    off-CPU type); wall-clock time (`report --event wall`): ``wall``/``nanoseconds``.

- every table in the request's one ``ProfilesDictionary``, entry 0 the zero value as the protocol asks,
  no entry twice: a frame is a ``Location`` (its ``Mapping``: the object's path, its GNU build-id as
  ``process.executable.build_id.gnu``; its address: the file offset of native code, the address of
  kernel and JIT code) with ``profile.frame.type`` ``kernel``, ``native`` or a runtime's frame kind
  (``cpython``: the registry's names are OpenTelemetry's; JIT code from perf maps and jitdumps has none:
  which runtime wrote it is not known) and a ``Line`` naming its ``Function`` (a runtime's frames: the
  function's file and first line, and the line it was running). A frame
  optrace could not name keeps no Line when it has a build-id, so a backend with the object's debug info
  can name it, as the OTel profiler leaves native frames; otherwise its Line is optrace's fallback name
  (``lib.so+0x1f2``, ``[unknown]``). A stack is a ``Stack`` of location indices, leaf first; a sample
  carries ``thread.name`` (its thread's comm) and its stack's value.

Names come from hostile processes and records: escaped and made valid UTF-8 as in pprof's writer.
"""
from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2

from optrace import __version__
from optrace.errors import OptraceError
from optrace.kernel import COMM_MAX
from optrace.exporters.pprof import INT64_MAX, UINT64_MAX, clamp, clean
from optrace.frontend.report.rows import UNKNOWN_FRAME, Profile, ReportOptions, selected_samples
from optrace.model import KERNEL_DSO, UNKNOWN, Frame, Record, Sample

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"  # the semantic conventions the attributes follow
SCOPE = "optrace"
NS_PER_S = 1_000_000_000
# event -> (sample type, unit); CPU samples also have a period type
SAMPLE_TYPES = {"cpu": ("samples", "count"), "off-cpu": ("off_cpu", "nanoseconds"), "wall": ("wall", "nanoseconds")}
CPU_PERIOD_TYPE = ("cpu", "nanoseconds")
BUILD_ID_KEY = "process.executable.build_id.gnu"
FRAME_TYPE_KEY = "profile.frame.type"
THREAD_NAME_KEY = "thread.name"

AttributeValue = str | int
Attribute = tuple[str, AttributeValue]


@dataclass(frozen=True)
class Resources:
    """What each process's resource says. ``host``: shared by all (``host.*``, ``os.type``, the user's
    OTEL_RESOURCE_ATTRIBUTES); ``processes``: per pid (``process.*``, ``container.id``), which win over
    ``host`` for a key both have; ``service_name``: OTEL_SERVICE_NAME, else each process's default."""

    host: tuple[Attribute, ...] = ()
    processes: Mapping[int, tuple[Attribute, ...]] = field(default_factory=dict)
    service_name: str = ""

    def of(self, pid: int) -> list[Attribute]:
        merged = dict(self.host)
        merged.update(self.processes.get(pid, ()))
        merged["process.pid"] = pid
        if self.service_name:
            merged["service.name"] = self.service_name
        elif "service.name" not in merged:
            name = merged.get("process.executable.name")
            merged["service.name"] = f"unknown_service:{name}" if name else "unknown_service"
        return list(merged.items())


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    """The request is binary: it goes to the stream's byte buffer, never to a terminal."""
    if not profile.record.meta.stacks:
        raise OptraceError("the record has no stacks (recorded with --no-stacks): OTLP profiles need them; "
                           "record again without --no-stacks, or use --format table")
    samples = selected_samples(profile.record, options)
    if not samples:
        raise OptraceError("no samples to write: the record is empty or the filters left nothing")
    if stream.isatty():
        raise OptraceError("OTLP output is binary: write it to a file with -o FILE")
    data = encode(profile.record, record_resources(profile.record), {profile.event: samples}).SerializeToString()
    stream.flush()
    stream.buffer.write(data)  # type: ignore[attr-defined]  # report's streams are TextIOWrappers


def record_resources(record: Record) -> Resources:
    """What a record file says about its host and processes: its host name, and for the processes of a
    recorded command (those whose comm is its program's name, as the kernel cuts it) the program, with
    the command line where one process has that name."""
    meta = record.meta
    processes: dict[int, tuple[Attribute, ...]] = {}
    if meta.command:
        program = os.path.basename(meta.command[0])
        comm = program.encode()[:COMM_MAX].decode(errors="ignore")
        pids = sorted({s.pid for s in record.samples + record.off_cpu if s.comm == comm})
        for pid in pids:
            attributes: tuple[Attribute, ...] = (("process.executable.name", program),)
            if os.path.isabs(meta.command[0]):
                attributes += (("process.executable.path", meta.command[0]),)
            if len(pids) == 1:
                attributes += (("process.command_line", " ".join(meta.command)),)
            processes[pid] = attributes
    return Resources(host=(("host.name", meta.hostname), ("os.type", "linux")), processes=processes)


def encode(record: Record, resources: Resources, events: Mapping[str, Iterable[Sample]]) -> ExportProfilesServiceRequest:
    """The request for ``events`` (event -> its samples, indices into ``record.frames``), timed by
    ``record.meta`` (start, duration, frequency)."""
    return _Builder(record, resources).build(events)


@dataclass
class _Builder:
    record: Record
    resources: Resources
    request: ExportProfilesServiceRequest = field(default_factory=ExportProfilesServiceRequest)
    strings: dict[str, int] = field(default_factory=dict)
    attributes: dict[Attribute, int] = field(default_factory=dict)
    functions: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (name, file, start line)
    mappings: dict[tuple[str, str], int] = field(default_factory=dict)  # (dso, build-id)
    locations: dict[int, int] = field(default_factory=dict)  # record frame index (-1: a lost stack) -> location
    location_ids: dict[tuple[int, int, int, int, int], int] = field(default_factory=dict)  # content -> location
    stacks: dict[tuple[int, ...], int] = field(default_factory=dict)
    build_ids: dict[str, str] = field(default_factory=dict)  # dso -> a build-id one of its frames has

    def build(self, events: Mapping[str, Iterable[Sample]]) -> ExportProfilesServiceRequest:
        dictionary = self.request.dictionary
        self.string("")
        for table in (dictionary.mapping_table, dictionary.location_table, dictionary.function_table,
                      dictionary.link_table, dictionary.attribute_table, dictionary.stack_table):
            table.add()  # entry 0: the zero value
        self.build_ids = {frame.dso: frame.build_id for frame in self.record.frames if frame.build_id}
        by_pid: dict[int, dict[str, list[Sample]]] = defaultdict(dict)
        for event, samples in events.items():
            if event not in SAMPLE_TYPES:
                raise OptraceError(f"OTLP has no sample type for event {event!r}")
            for sample in samples:
                by_pid[sample.pid].setdefault(event, []).append(sample)
        for pid in sorted(by_pid):
            self._resource(pid, by_pid[pid])
        dictionary.string_table.extend(self.strings)
        return self.request

    def _resource(self, pid: int, events: dict[str, list[Sample]]) -> None:
        resource_profiles = self.request.resource_profiles.add(schema_url=SCHEMA_URL)
        resource_profiles.resource.attributes.extend(
            KeyValue(key=key, value=any_value(value)) for key, value in self.resources.of(pid))
        scope = resource_profiles.scope_profiles.add(schema_url=SCHEMA_URL)
        scope.scope.name, scope.scope.version = SCOPE, __version__
        for event, samples in events.items():
            self._profile(scope.profiles.add(), pid, event, samples)

    def _profile(self, profile: profiles_pb2.Profile, pid: int, event: str, samples: list[Sample]) -> None:
        meta = self.record.meta
        kind, unit = SAMPLE_TYPES[event]
        profile.sample_type.type_strindex, profile.sample_type.unit_strindex = self.string(kind), self.string(unit)
        if event == "cpu":
            profile.period_type.type_strindex = self.string(CPU_PERIOD_TYPE[0])
            profile.period_type.unit_strindex = self.string(CPU_PERIOD_TYPE[1])
            profile.period = NS_PER_S // max(meta.frequency_hz, 1)
        profile.time_unix_nano = clamp(meta.started * NS_PER_S, UINT64_MAX)
        profile.duration_nano = clamp(meta.duration_s * NS_PER_S, UINT64_MAX)
        profile.profile_id = hashlib.blake2b(f"{meta.hostname} {pid} {event} {profile.time_unix_nano}".encode(),
                                             digest_size=16).digest()
        threads: dict[str, int] = {}
        for sample in samples:
            thread = threads.get(sample.comm)
            if thread is None:
                thread = threads[sample.comm] = self.attribute((THREAD_NAME_KEY, clean(sample.comm)))
            added = profile.samples.add(stack_index=self._stack(sample.frames), values=(min(sample.count, INT64_MAX),))
            added.attribute_indices.append(thread)

    def _stack(self, frames: tuple[int, ...]) -> int:
        index = self.stacks.get(frames)
        if index is None:
            table = self.request.dictionary.stack_table
            index = self.stacks[frames] = len(table)
            locations = list(map(self.locations.get, frames or (-1,)))  # in C: most frames are known already
            if None in locations:
                locations = [self._location(f) for f in frames or (-1,)]
            table.add().location_indices.extend(locations)
        return index

    def _location(self, frame_index: int) -> int:
        index = self.locations.get(frame_index)
        if index is None:
            frame = self.record.frames[frame_index] if frame_index >= 0 else UNKNOWN_FRAME
            kind = frame_type(frame)
            named = frame.resolved or not frame.build_id
            key = (self._mapping(frame), 0 if frame.runtime else clamp(frame.address, UINT64_MAX),
                   self.attribute((FRAME_TYPE_KEY, kind)) if kind else 0,
                   self._function(frame) if named else 0, frame.line if named else 0)
            index = self.locations[frame_index] = self.location_ids.get(key) or self._add_location(key)
        return index

    def _add_location(self, key: tuple[int, int, int, int, int]) -> int:
        """A Location for (mapping, address, frame type attribute, function, line); 0 means none."""
        mapping, address, kind, function, line = key
        table = self.request.dictionary.location_table
        index = self.location_ids[key] = len(table)
        location = table.add(mapping_index=mapping, address=address)
        if kind:
            location.attribute_indices.append(kind)
        if function:
            location.lines.add(function_index=function, line=line)
        return index

    def _function(self, frame: Frame) -> int:
        name = self.string(clean(frame.symbol))
        filename = self.string(clean(frame.dso)) if frame.runtime else 0
        start = frame.address if frame.runtime else 0
        key = (name, filename, start)
        index = self.functions.get(key)
        if index is None:
            table = self.request.dictionary.function_table
            index = self.functions[key] = len(table)
            table.add(name_strindex=name, filename_strindex=filename, start_line=start)
        return index

    def _mapping(self, frame: Frame) -> int:
        """The object a frame is in (none for a runtime's frames, whose dso is their source file, and for
        unknown ones)."""
        if frame.runtime or frame.dso == UNKNOWN:
            return 0
        build_id = frame.build_id or self.build_ids.get(frame.dso, "")
        key = (frame.dso, build_id)
        index = self.mappings.get(key)
        if index is None:
            table = self.request.dictionary.mapping_table
            index = self.mappings[key] = len(table)
            mapping = table.add(filename_strindex=self.string(clean(frame.dso)))
            if build_id:
                mapping.attribute_indices.append(self.attribute((BUILD_ID_KEY, clean(build_id))))
        return index

    def string(self, text: str) -> int:
        index = self.strings.get(text)
        if index is None:
            index = self.strings[text] = len(self.strings)
        return index

    def attribute(self, attribute: Attribute) -> int:
        index = self.attributes.get(attribute)
        if index is None:
            table = self.request.dictionary.attribute_table
            index = self.attributes[attribute] = len(table)
            table.add(key_strindex=self.string(attribute[0]), value=any_value(attribute[1]))
        return index


def any_value(value: AttributeValue) -> AnyValue:
    if isinstance(value, int):
        return AnyValue(int_value=value)
    return AnyValue(string_value=clean(value))


def frame_type(frame: Frame) -> str | None:
    """``profile.frame.type`` of a frame (semantic conventions' values), None where it is not known."""
    if frame.kernel or frame.dso == KERNEL_DSO:
        return "kernel"
    if frame.runtime:
        return frame.kind  # a runtime's name is OpenTelemetry's frame type for it (frontend/runtimes/registry.py)
    if frame.dso.startswith("[jit]") or frame.dso == UNKNOWN or frame.dso.startswith("[optrace"):
        return None
    return "native"
