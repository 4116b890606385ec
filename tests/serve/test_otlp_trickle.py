"""Issue 40, item 4: an OTLP receiver that trickles its answer (a byte a second, never a whole one) holds
the sender no longer than --otlp-timeout per try, for each protocol: every try ends as a retryable failure
and the next comes after the backoff, and a warning says so once requests have waited with nothing sent
(FAILING_WARN_S, shortened here). On main before the fix, OTLP/HTTP's one try never ended (0 retries, no
warning after 60 s); gRPC's call deadline did end its tries, but nothing warned."""
from __future__ import annotations

import time

import pytest

from optrace.frontend.serve import otlpexport
from serve.test_otlp_export import Running, StackSource, options, page_of
from serve.tricklereceiver import TricklingReceiver

TIMEOUT_S = 2
WARN_AFTER_S = 6.0
RUN_S = 15.0  # at most: the run ends once 3 tries have ended and ONCE_S have passed since the warning
ONCE_S = 3.0  # a warning that came again would have by then (it is looked at every drain, 50 ms here)
REASONS = {"http/protobuf": "deadline", "grpc": "DEADLINE_EXCEEDED"}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_trickling_receiver_costs_one_timeout_a_try(protocol: str, expo, monkeypatch) -> None:
    monkeypatch.setattr(otlpexport, "FAILING_WARN_S", WARN_AFTER_S)
    receiver = TricklingReceiver(protocol, every_s=1.0)
    warnings: list[str] = []
    running = Running(options(receiver.endpoint, protocol, otlp_timeout=TIMEOUT_S), StackSource())
    running.daemon._on_warning = warnings.append
    try:
        started = time.monotonic()
        page = run_until_told(running, expo, protocol, warnings, started + RUN_S)
    finally:
        stopping = time.monotonic()
        running.stop()
        stopped_s = time.monotonic() - stopping
        receiver.stop()
    retries = expo.value(page, "optrace_otlp_retries_total", reason=REASONS[protocol])
    print(f"{protocol}: {retries:.0f} tries ended by the deadline in {time.monotonic() - started:.0f} s, "
          f"{receiver.connections} connections; stop took {stopped_s:.1f} s; warnings: {warnings}")
    # tries of 2 s, backoffs of 1, 2, 4 s (+-50 %): at least 3 ended within 15 s (about 10 s); one that never
    # ended: 0
    assert retries >= 3
    assert expo.value(page, "optrace_otlp_requests_total", outcome="sent") == 0
    stalled = [w for w in warnings if "nothing sent for" in w and receiver.endpoint.split("//")[1] in w]
    assert len(stalled) == 1, warnings
    assert stopped_s < 10  # a try in flight does not hold serve's stop


def run_until_told(running: Running, expo, protocol: str, warnings: list[str], deadline: float) -> str:
    """The /metrics page once 3 tries have ended by the deadline and ONCE_S have passed since the first warning
    (a fixed 15 s run before: the same page, 5 s sooner), or at ``deadline`` whatever it says."""
    warned_at = None
    while True:
        page = page_of(running, expo)
        now = time.monotonic()
        if warned_at is None and warnings:
            warned_at = now
        told = expo.value(page, "optrace_otlp_retries_total", reason=REASONS[protocol]) >= 3
        if now >= deadline or (told and warned_at is not None and now - warned_at >= ONCE_S):
            return page
        time.sleep(0.2)
