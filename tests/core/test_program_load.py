"""A program the kernel refuses is reported as that, not as the perf event it was to be attached to."""
from __future__ import annotations

import pytest

from optrace.errors import OptraceError

pytestmark = pytest.mark.usefixtures("bpf_ready")


class RefusingProgram:
    """BCC's object for a compiled program whose functions the kernel does not load (as when the
    verifier is interrupted, or a capability is missing)."""

    def load_func(self, name, prog_type, **kw):
        raise Exception(f"Failed to load BPF program {name!r}: Resource temporarily unavailable")

    def attach_perf_event(self, **kw):
        raise AssertionError("attached a program that was not loaded")


def test_a_refused_sampler_is_named_in_the_error():
    from optrace.bpf.profiler import Profiler

    profiler = Profiler(99, pids=None)
    profiler._bpf = RefusingProgram()
    with pytest.raises(OptraceError) as caught:
        profiler._attach_sampler()
    message = str(caught.value)
    assert "the kernel did not load the BPF program on_sample" in message and "temporarily unavailable" in message
    assert "perf event" not in message


def test_a_refused_walker_is_named_in_the_error():
    from optrace.bpf.unwindmaps import UnwindMaps

    maps = UnwindMaps.__new__(UnwindMaps)
    maps._bpf = RefusingProgram()
    with pytest.raises(OptraceError, match="did not load the BPF program unwind_step"):
        maps.load_step()
