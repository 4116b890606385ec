"""`--format pprof`: the gzipped ``profile.proto`` that `go tool pprof`, Pyroscope and Parca read.

Built like Go's own CPU profiles: two sample types, ``samples/count`` and ``cpu/nanoseconds`` (the
default, as in Go), a period of one sampling interval, the record's start and duration. Each distinct
frame of the record is a Location with one Line whose Function is (symbol, dso); each dso is a Mapping
with its build-id, marked as already symbolized so pprof never looks for the binaries. Every sample
keeps its ``comm`` (string) and ``pid`` (number) as labels (``-tagfocus``, ``-tags``), and ``tid`` where
the event recorded threads.

``report --event off-cpu`` (or ``wall``) writes one sample type, ``off_cpu/nanoseconds`` (``wall/nanoseconds``),
with a period of one nanosecond: each sample's value is the time its stack waited (or ran and waited).

The message is built with the official ``protobuf`` runtime from the ``profile.proto`` of
google/pprof (see :mod:`optrace.exporters.pprofproto`). Names come from hostile records: controls are
escaped and lone surrogates replaced, so every string is valid UTF-8 for the encoder; numbers are
clamped to the fields' ranges.

Filters are those of `--format folded`: --pid/--comm select stacks, --dso matches the leaf frame,
--percent-limit drops samples (one per process and stack) below that share of all samples.
"""
from __future__ import annotations

import gzip
import heapq
import math
import os
from itertools import chain
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from optrace import __version__
from optrace.errors import OptraceError
from optrace.escape import escape_controls
from optrace.exporters.pprofproto import profile_pb2
from optrace.frontend.report.rows import (
    UNKNOWN_FRAME,
    Profile,
    ReportOptions,
    dso_selected,
    sample_total,
    selected_samples,
)
from optrace.model import Frame, Record, Sample

INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
MAIN_SAMPLES = 1000  # the heaviest samples that decide the main binary
GZIP_LEVEL = 6  # what Go's runtime/pprof writes with (gzip.DefaultCompression)


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    """The profile is binary: it goes to the stream's byte buffer, never to a terminal."""
    data = encode(profile.record, options, profile.source, event=profile.event)
    if stream.isatty():
        raise OptraceError("pprof output is binary: write it to a file with -o FILE.pb.gz")
    stream.flush()
    stream.buffer.write(data)  # type: ignore[attr-defined]  # report's streams are TextIOWrappers


def encode(record: Record, options: ReportOptions = ReportOptions(), source: str = "", empty_ok: bool = False,
           event: str = "cpu") -> bytes:
    """The gzipped profile of ``record``. Raises OptraceError when there is nothing to show, unless
    ``empty_ok`` (serve: a quiet machine's window is an empty profile, as Go's). ``event``: what the
    record's samples count (frontend/report/events.py)."""
    if not record.meta.stacks:
        raise OptraceError("the record has no stacks (recorded with --no-stacks): pprof needs them; "
                           "record again without --no-stacks, or use --format table")
    stacks = _stacks(record, options)
    if not stacks and not empty_ok:
        raise OptraceError("no samples to write: the record is empty or the filters left nothing")
    message = _Builder(record, event).build(stacks, source)
    return gzip.compress(message.SerializeToString(), compresslevel=GZIP_LEVEL, mtime=0)  # same record, same bytes


def _stacks(record: Record, options: ReportOptions) -> list[Sample]:
    """The samples to write. A record holds one sample per (pid, comm, stack) already: none are merged."""
    selected = [dso_selected(frame, options.dsos) for frame in record.frames]
    unknown_selected = dso_selected(UNKNOWN_FRAME, options.dsos)
    least = math.ceil(options.percent_limit * sample_total(record) / 100) if options.percent_limit else 1
    return [sample for sample in selected_samples(record, options)
            if sample.count >= least and (selected[sample.frames[0]] if sample.frames else unknown_selected)]


def clean(text: str) -> str:
    """Printable, valid UTF-8 text: protobuf refuses lone surrogates, and pprof prints names to terminals."""
    return escape_controls(text).encode("utf-8", "backslashreplace").decode("utf-8")


def clamp(value: float, high: int = INT64_MAX) -> int:
    """A record's number as the proto field takes it (int64, or uint64 for addresses)."""
    return max(0, min(int(value), high))


@dataclass
class _Builder:
    """Interns strings, functions and mappings as the samples need them (ids from 1)."""

    record: Record
    event: str = "cpu"  # else the samples count nanoseconds (frontend/report/events.py)
    message: profile_pb2.Profile = field(default_factory=profile_pb2.Profile)
    strings: dict[str, int] = field(default_factory=dict)
    functions: dict[tuple[str, str], int] = field(default_factory=dict)
    mappings: dict[str, int] = field(default_factory=dict)
    build_ids: dict[str, str] = field(default_factory=dict)  # dso -> a build-id one of its frames has

    def build(self, stacks: list[Sample], source: str) -> profile_pb2.Profile:
        meta = self.record.meta
        message = self.message
        self.string("")  # string_table[0] must be ""
        if self.event == "cpu":
            period = 1_000_000_000 // max(meta.frequency_hz, 1)
            message.sample_type.add(type=self.string("samples"), unit=self.string("count"))
            kind = "cpu"
        else:
            period = 0  # the counts are nanoseconds already: one value per sample
            kind = self.event.replace("-", "_")
        message.sample_type.add(type=self.string(kind), unit=self.string("nanoseconds"))
        message.period_type.type, message.period_type.unit = self.string(kind), self.string("nanoseconds")
        message.period = period or 1
        message.time_nanos = clamp(meta.started * 1e9)
        message.duration_nanos = clamp(meta.duration_s * 1e9)
        message.default_sample_type = self.string(kind)
        message.comment.extend(self.string(clean(text)) for text in self._comments(source))
        self.build_ids = {frame.dso: frame.build_id for frame in self.record.frames if frame.build_id}
        self.mapping(self._main_object(stacks))
        self._add_locations(stacks)
        self._add_samples(stacks, period)
        message.string_table.extend(self.strings)
        return message

    def _add_samples(self, stacks: list[Sample], period: int) -> None:
        """The hot loop: per sample, three calls into the protobuf runtime and no Python per frame.
        ``period`` 0: the counts are nanoseconds, the sample's one value."""
        message = self.message
        comm_key, pid_key, tid_key = self.string("comm"), self.string("pid"), self.string("tid")
        location_id = (1).__add__  # a frame's location id is its index + 1 (see _add_locations)
        lost_stack = (len(self.record.frames) + 1,)
        comms: dict[str, int] = {}
        for sample in stacks:
            comm = comms.get(sample.comm)
            if comm is None:
                comm = comms[sample.comm] = self.string(clean(sample.comm))
            count = min(sample.count, INT64_MAX)
            added = message.sample.add()
            added.location_id.extend(map(location_id, sample.frames) if sample.frames else lost_stack)
            added.value.extend((count, min(count * period, INT64_MAX)) if period else (count,))
            added.label.add(key=comm_key, str=comm)
            added.label.add(key=pid_key, num=sample.pid)
            if sample.tid:
                added.label.add(key=tid_key, num=sample.tid)

    def _main_object(self, stacks: list[Sample]) -> Frame:
        """pprof takes mapping[0] as the main binary: the recorded command's, else the program of the most
        samples among the MAIN_SAMPLES heaviest (the outermost frame, from the root in, that is not in a
        shared library: stacks often start in libc's start-up code)."""
        frames = self.record.frames
        command = self.record.meta.command
        program = os.path.basename(command[0]) if command else None
        if program:
            for frame in frames:
                if os.path.basename(frame.dso) == program:
                    return frame
        programs = [not (frame.kernel or ".so" in os.path.basename(frame.dso) or frame.dso.startswith("["))
                    for frame in frames]
        roots: Counter[int] = Counter()
        for sample in heapq.nlargest(MAIN_SAMPLES, stacks, key=lambda sample: sample.count):
            outer = [index for index in reversed(sample.frames) if not frames[index].kernel]
            if outer:
                roots[next((index for index in outer if programs[index]), outer[0])] += sample.count
        return frames[roots.most_common(1)[0][0]] if roots else UNKNOWN_FRAME

    def _comments(self, source: str) -> list[str]:
        meta = self.record.meta
        what = f"{meta.event} at {meta.frequency_hz} Hz" if self.event == "cpu" else f"{self.event} in nanoseconds"
        comments = [f"optrace {__version__}: {what} on {meta.hostname} ({meta.kernel})"]
        if meta.command:
            comments.append("command: " + " ".join(meta.command))
        if source:
            comments.append(f"record: {source}")
        lost = sum(meta.lost.values())
        if lost:
            comments.append(f"lost samples or stacks: {lost}")
        return comments

    def string(self, text: str) -> int:
        index = self.strings.get(text)
        if index is None:
            index = self.strings[text] = len(self.strings)
        return index

    def _add_locations(self, stacks: list[Sample]) -> None:
        """A Location per frame the samples use, with id = frame index + 1 (ids need only be unique and
        non-zero), so each stack's ids come from one ``map`` in C: 100,000 stacks of 20 frames are 2
        million ids. A lost stack is the location after the last frame, [unknown]."""
        frames = self.record.frames
        used = set(chain.from_iterable(sample.frames for sample in stacks))
        if any(not sample.frames for sample in stacks):
            used.add(len(frames))
        for index in sorted(used):
            frame = frames[index] if index < len(frames) else UNKNOWN_FRAME
            location = self.message.location.add(id=index + 1, mapping_id=self.mapping(frame),
                                                 address=0 if frame.runtime else clamp(frame.address, UINT64_MAX))
            location.line.add(function_id=self.function(frame), line=frame.line)

    def function(self, frame: Frame) -> int:
        """A Python function has its source file and first line (Frame.address), as pprof's Go frames do."""
        key = (frame.symbol, frame.dso)
        function_id = self.functions.get(key)
        if function_id is None:
            function_id = self.functions[key] = len(self.functions) + 1
            name = self.string(clean(frame.symbol))
            self.message.function.add(id=function_id, name=name, system_name=name,
                                      filename=self.string(clean(frame.dso)),
                                      start_line=frame.address if frame.runtime else 0)
        return function_id

    def mapping(self, frame: Frame) -> int:
        mapping_id = self.mappings.get(frame.dso)
        if mapping_id is None:
            mapping_id = self.mappings[frame.dso] = len(self.mappings) + 1
            self.message.mapping.add(id=mapping_id, filename=self.string(clean(frame.dso)),
                                     build_id=self.string(clean(self.build_ids.get(frame.dso, ""))),
                                     has_functions=True)
        return mapping_id
