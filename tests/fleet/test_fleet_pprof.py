"""`go tool pprof` pulls each agent's /debug/pprof/profile, as Parca and Alloy do, all three at once: each
names the workload's hot function, with its share of the workload's samples."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetkit import HOT, Fleet
from optrace.frontend.serve.routes import PROFILE_PATH
from pprofclient import TopRow, top

SECONDS = 5
# Prometheus starts first: its history grows while the profiles are collected (test_fleet_prometheus.py)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prometheus")]


def pull(url: str, tmp: Path) -> dict[str, TopRow]:
    tmp.mkdir()
    return top(url, tmp)


def test_go_tool_pprof_names_the_hot_function_on_every_agent(fleet: Fleet, tmp_path: Path) -> None:
    urls = [f"{agent.base}{PROFILE_PATH}?seconds={SECONDS}" for agent in fleet.agents]
    with ThreadPoolExecutor(len(urls)) as pool:
        tops = list(pool.map(pull, urls, [tmp_path / agent.host for agent in fleet.agents]))
    told = {agent.host: [(row.name, row.flat_percent) for row in sorted(rows.values(), key=lambda r: -r.flat_percent)[:5]]
            for agent, rows in zip(fleet.agents, tops)}
    for rows in tops:
        hottest = max(rows.values(), key=lambda row: row.flat_percent)
        assert hottest.name == HOT, told
        assert abs(rows[HOT].flat_percent - 40) <= 5, told  # by design
