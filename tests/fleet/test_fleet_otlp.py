"""The fleet's OTLP part: three `optrace serve` agents on 127.0.0.2-4 push whole-machine profiles to one
receiver built on opentelemetry-proto's generated ProfilesService servicer, which decodes them: each
agent's profiles name the workloads' hot function (demo: hot_a 40 %, under main), and for each workload
their values add up to the samples the agent's own /metrics counts (optrace_cpu_seconds_total x -F) within
2 %. The receiver killed mid-run: every agent's queue stays within its bound, its memory does not grow
past it, the oldest profiles are dropped and counted, and exports resume once the receiver is back.
The same over http/protobuf to a small HTTP receiver, from one agent; and with --off-cpu, off-CPU time as a
profile of its own."""
from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from fleetagents import (AGENT_KEY, FLEET_ARGS, FLEET_HZ, QUEUE_BYTES, Agent, demo_copy, fake_container, otlp_fleet,  # noqa: F401
                         start_agent, workloads_running)
from otlpdecode import DecodedProfile, plain
from otlpreceiver import GrpcReceiver, HttpReceiver, Inbox, Received

pytestmark = [pytest.mark.bpf, pytest.mark.slow]
CPU = "optrace_cpu_seconds_total"  # samples / -F
WORKLOADS = ("otlpdemo2", "otlpdemo3", "otlpdemo4")


def metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def wait_for(predicate, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def settled(agents: list[Agent], interval_s: int = 2) -> None:
    """Wait until what ran before is in every agent's counters (2 drains), its interval has closed (that
    interval and a drain more: drains come every second) and its queue has been sent."""
    def drained(count: int) -> None:
        start = {agent.name: metric(agent.scrape(), "optrace_drains_total") for agent in agents}
        wait_for(lambda: all(metric(a.scrape(), "optrace_drains_total") >= start[a.name] + count for a in agents), 60,
                 f"{count} drains")

    drained(2)
    drained(interval_s + 2)
    wait_for(lambda: all(metric(a.scrape(), "optrace_otlp_queue_requests") == 0 for a in agents), 60, "queues sent")


def cpu_profiles(inbox: Inbox, agent: Agent) -> list[DecodedProfile]:
    return [p for p in inbox.profiles() if p.resource.get(AGENT_KEY) == agent.name and p.sample_type[0] == "samples"]


def of_comm(profiles: list[DecodedProfile], comm: str) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, leaf function -> samples, function -> samples through it) of the thread name ``comm``."""
    total, leaves, inclusive = 0, Counter(), Counter()
    for profile in profiles:
        for sample in profile.samples:
            if sample.attributes.get("thread.name") == comm:
                total += sample.value
                leaves[sample.stack[0].name] += sample.value
                for name in {frame.name for frame in sample.stack}:
                    inclusive[name] += sample.value
    return total, leaves, inclusive


def check_agent_against_its_counters(inbox: Inbox, agent: Agent, comms: tuple[str, ...]) -> dict[str, tuple]:
    page = agent.scrape()
    assert metric(page, "optrace_otlp_requests_total", outcome="sent") >= 1
    assert metric(page, "optrace_otlp_requests_total") == metric(page, "optrace_otlp_requests_total", outcome="sent"), \
        (agent.name, "requests were dropped or rejected", [line for line in page.splitlines() if "otlp" in line])
    profiles = cpu_profiles(inbox, agent)
    found = {}
    for comm in comms:
        counted = metric(page, CPU, comm=comm) * FLEET_HZ  # samples
        total, leaves, inclusive = of_comm(profiles, comm)
        found[comm] = (counted, total, leaves["hot_a"] / max(total, 1), inclusive["main"] / max(total, 1))
        assert counted > 0.8 * 2 * FLEET_HZ, (agent.name, comm, found[comm])  # 2 s of CPU, give or take
        assert abs(total - counted) <= 0.02 * counted, (agent.name, comm, found[comm])
        assert abs(leaves["hot_a"] / total - 0.40) <= 0.05, (agent.name, comm, leaves.most_common(6))
        assert inclusive["main"] >= 0.9 * total, (agent.name, comm, inclusive.most_common(8))
    return found


@pytest.fixture(scope="module")
def fleet_run(otlp_fleet, workloads, tmp_path_factory):
    """The three workloads, each 2 s of CPU, at once (one in a container), while the fleet profiles the machine."""
    folder = tmp_path_factory.mktemp("fleet-workloads")
    programs = [demo_copy(workloads, folder, name) for name in WORKLOADS]
    with fake_container() as (container, cgroup):
        with workloads_running(([str(programs[0]), "2"], cgroup), *(([str(p), "2"], None) for p in programs[1:])) as runs:
            assert [process.wait(120) for process in runs] == [0, 0, 0]
    settled(otlp_fleet.agents)
    return otlp_fleet, programs, container


def test_every_agent_pushes_the_workloads_named_and_counted(fleet_run) -> None:
    fleet, programs, container = fleet_run
    for agent in fleet.agents:
        check_agent_against_its_counters(fleet.receiver.inbox, agent, WORKLOADS)
        assert metric(agent.scrape(), "optrace_otlp_requests_total", outcome="rejected") == 0
        lines = agent.stderr_path.read_text().splitlines()  # gRPC's own logging never reaches serve's stderr
        assert all(line.startswith("optrace: ") for line in lines), lines


def test_resources_say_which_host_process_and_container(fleet_run) -> None:
    fleet, programs, container = fleet_run
    profiles = cpu_profiles(fleet.receiver.inbox, fleet.agents[0])
    by_program = {p.resource.get("process.executable.name"): p.resource for p in profiles}
    for program in programs:
        resource = by_program[program.name]
        assert resource["process.executable.path"] == str(program)
        assert resource["process.command_line"] == f"{program} 2"
        assert resource["service.name"] == f"unknown_service:{program.name}"
        assert resource["host.name"] == os.uname().nodename and resource["os.type"] == "linux"
        assert isinstance(resource["process.pid"], int)
    assert by_program[programs[0].name]["container.id"] == container  # from its cgroup
    assert "container.id" not in by_program[programs[1].name]
    frames = {frame for p in profiles for s in p.samples if s.attributes.get("thread.name") == programs[0].name
              for frame in s.stack if frame.name == "hot_a"}
    assert frames and all(f.mapping == str(programs[0]) and f.frame_type == "native" and len(f.build_id) == 40
                          for f in frames)


def test_receiver_killed_then_back(fleet_run, workloads) -> None:
    """While the receiver is down (a workload and the machine's other work go on), every agent's queue stays
    within its bound at every scrape until it has had to drop its oldest requests (counted), and its RSS
    grows by less than that bound plus allocator noise; once the receiver is back on its port, every
    agent's exports resume."""
    fleet, programs, container = fleet_run
    receiver = fleet.receiver
    before_rss = {agent.name: agent.rss_bytes() for agent in fleet.agents}
    receiver.stop()
    highest, rss, pages = Counter(), Counter(), {}
    with workloads_running(([str(programs[1]), "30"], None)) as [running]:
        deadline = time.monotonic() + 120
        while len(pages) < len(fleet.agents) and time.monotonic() < deadline:
            for agent in fleet.agents:
                page = agent.scrape()
                queued, bound = metric(page, "optrace_otlp_queue_bytes"), metric(page, "optrace_otlp_queue_max_bytes")
                assert queued <= bound == QUEUE_BYTES, (agent.name, queued, bound)
                highest[agent.name] = max(highest[agent.name], queued)
                rss[agent.name] = max(rss[agent.name], agent.rss_bytes())
                if metric(page, "optrace_otlp_requests_total", outcome="dropped_queue_full") >= 1:
                    pages.setdefault(agent.name, page)
            time.sleep(0.5)
        running.kill()
    assert len(pages) == len(fleet.agents), ("an agent never filled its queue", dict(highest))
    received = receiver.inbox.count()
    receiver.start()  # the same port
    for agent in fleet.agents:
        assert metric(pages[agent.name], "optrace_otlp_retries_total") >= 1, agent.name
        assert rss[agent.name] - before_rss[agent.name] <= QUEUE_BYTES + (24 << 20), (agent.name, rss, before_rss)
    wait_for(lambda: agents_in(receiver.inbox.received[received:]) >= {agent.name for agent in fleet.agents}, 90,
             "every agent's exports to resume")
    for agent in fleet.agents:
        sent = metric(agent.scrape(), "optrace_otlp_requests_total", outcome="sent")
        assert sent > metric(pages[agent.name], "optrace_otlp_requests_total", outcome="sent"), agent.name


def agents_in(received: list[Received]) -> set[str]:
    return {plain(kv.value) for r in received for rp in r.request.resource_profiles for kv in rp.resource.attributes
            if kv.key == AGENT_KEY}


def test_http_protobuf_agent(bpf_ready, workloads, tmp_path) -> None:
    """One agent over http/protobuf (OTEL_EXPORTER_OTLP_PROTOCOL) to an HTTP receiver at the spec's path."""
    receiver = HttpReceiver("127.0.0.1")
    program = demo_copy(workloads, tmp_path / "w", "otlphttpdemo")
    agent = start_agent("127.0.0.5", FLEET_ARGS + ["--comm", program.name], tmp_path,
                        {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                         "OTEL_EXPORTER_OTLP_HEADERS": "x-scope-orgid=fleet"})
    try:
        with workloads_running(([str(program), "2"], None)) as [running]:
            assert running.wait(120) == 0
        settled([agent])
        check_agent_against_its_counters(receiver.inbox, agent, (program.name,))
        assert {r.headers["x-scope-orgid"] for r in receiver.inbox.received} == {"fleet"}
    finally:
        assert agent.stop() == 0
        receiver.stop()


def test_off_cpu_is_its_own_profile(bpf_ready, workloads, tmp_path) -> None:
    """serve --off-cpu: off-CPU time comes as off_cpu/nanoseconds profiles of whole stacks (from schedule()
    in the kernel to main), their values the agent's own optrace_offcpu_seconds_total within 2 %."""
    receiver = GrpcReceiver()
    program = tmp_path / "offcpu_otlp"
    shutil.copy(workloads / "offcpu", program)
    comms = ("sleeper", "pipe_reader")
    agent = start_agent("127.0.0.6", ["--off-cpu", "--otlp-interval", "2", *(f"--comm={c}" for c in comms),
                                      "--comm", program.name, "--otlp-endpoint", receiver.endpoint], tmp_path)
    try:
        with workloads_running(([str(program), "1"], None)) as [running]:
            assert running.wait(120) == 0
        settled([agent])
        page = agent.scrape()
        profiles = [p for p in receiver.inbox.profiles() if p.sample_type == ("off_cpu", "nanoseconds")]
        assert profiles and all(p.period == 0 and p.period_type == ("", "") for p in profiles)
        for comm in comms:
            counted = metric(page, "optrace_offcpu_seconds_total", comm=comm) * 1e9
            total, leaves, inclusive = of_comm(profiles, comm)
            assert counted > 0.3e9 and abs(total - counted) <= 0.02 * counted, (comm, total, counted)
            assert inclusive["schedule"] >= 0.98 * total, (comm, leaves.most_common(4))
        assert of_comm(profiles, "sleeper")[2]["clock_nanosleep"] >= 0.9 * of_comm(profiles, "sleeper")[0]
        assert of_comm(profiles, "pipe_reader")[2]["read"] >= 0.8 * of_comm(profiles, "pipe_reader")[0]
    finally:
        assert agent.stop() == 0
        receiver.stop()
