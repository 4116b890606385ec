"""One real Prometheus scraping the three agents with docs/fleet/prometheus.yml's job and recording rule:
the fleet-wide topk names the workload's hot function; every query of the Grafana dashboard and of
docs/fleet.md returns data, with the answers they promise; the Kubernetes job's relabeling, run by a second
Prometheus on the __meta_kubernetes_* labels of three pods, makes the agents its targets, named by node.

Time ranges are shortened to fit a test: the dashboard's $__range and the docs' [1h] become WINDOW seconds,
"offset $compare" and "offset 1d" OFFSET seconds (the queries are otherwise run as written)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import grafanadash
from fleetkit import CPU_RULE, FLEET, HOSTS, HOT, K8S_LABEL, SCRAPE_S, Fleet, prometheus_config, wait_history
from prometheusserver import Prometheus, api, query, running_prometheus
from serve.test_serve_bpf import wait_for
from support import REPO

pytestmark = pytest.mark.slow
WINDOW = OFFSET = 5  # seconds
HISTORY = WINDOW + OFFSET + 4 * SCRAPE_S  # what the queries need Prometheus to have scraped
DASHBOARD = FLEET / "grafana-dashboard.json"
DOC = REPO / "docs" / "fleet.md"
CHANGED = "What changed since $compare ago"


def values(result: list[dict], label: str) -> dict[str, float]:
    return {row["metric"].get(label, ""): float(row["value"][1]) for row in result}


def test_topk_across_agents_names_the_hot_function(fleet: Fleet, prometheus: Prometheus) -> None:
    at = wait_history(prometheus, 4 * SCRAPE_S)
    top = query(prometheus.base, f"topk(1, sum by (symbol) ({CPU_RULE}))", at)
    assert [row["metric"]["symbol"] for row in top] == [HOT]
    hosts = values(query(prometheus.base, f'sum by (instance) ({CPU_RULE}{{symbol="{HOT}"}})', at), "instance")
    assert set(hosts) == set(HOSTS) and all(cores > 0 for cores in hosts.values())
    per_host = values(query(prometheus.base, f"sum by (instance) ({CPU_RULE})", at), "instance")
    assert all(0 < cores <= 1.05 for cores in per_host.values()), per_host  # one thread: at most one core


def dashboard_values(dashboard: dict, hosts: str) -> dict[str, str]:
    """What a user picks: job optrace, ``hosts``, the function hot_a, compared with OFFSET s earlier."""
    picked = {"datasource": "prometheus", "job": "optrace", "host": hosts, "function": HOT,
              "compare": f"{OFFSET}s", "__range": f"{WINDOW}s", "__rate_interval": f"{4 * SCRAPE_S}s"}
    assert set(grafanadash.variables(dashboard)) | {"__range", "__rate_interval"} == set(picked)
    return picked


@pytest.mark.parametrize("hosts", ["each", "all"])
def test_every_dashboard_query_returns_data(prometheus: Prometheus, hosts: str) -> None:
    """Each host picked (Grafana's regex of their names) or All (the variable's allValue)."""
    dashboard = grafanadash.load(DASHBOARD)
    chosen = grafanadash.multi_value(list(HOSTS)) if hosts == "each" else \
        grafanadash.variables(dashboard)["host"]["allValue"]
    picked = dashboard_values(dashboard, chosen)
    at = wait_history(prometheus, HISTORY)
    answers = {}
    for panel_query in grafanadash.queries(dashboard):
        promql = grafanadash.interpolate(panel_query.expr, picked)
        answers[panel_query.panel] = query(prometheus.base, promql, at)
        assert answers[panel_query.panel], f"{panel_query.panel}: no data for {promql}"
    hottest = max(answers["Top functions by CPU across the fleet"], key=lambda row: float(row["value"][1]))
    assert hottest["metric"]["symbol"] == HOT
    assert set(values(answers["Hosts running $function"], "instance")) == set(HOSTS)
    assert set(values(answers["CPU by host"], "instance")) == set(HOSTS)
    assert values(answers["Agents up"], "instance") == dict.fromkeys(HOSTS, 1.0)


def test_the_changed_panel_compares_with_the_past(prometheus: Prometheus) -> None:
    """The change is now minus then, per function, then being OFFSET s earlier (and there is a then)."""
    dashboard = grafanadash.load(DASHBOARD)
    picked = dashboard_values(dashboard, ".+")
    [changed] = [q.expr for q in grafanadash.queries(dashboard) if q.panel == CHANGED]
    at = wait_history(prometheus, HISTORY)
    window = f'{CPU_RULE}{{job="optrace"}}[{WINDOW}s]'
    now = values(query(prometheus.base, f"sum by (symbol) (avg_over_time({window}))", at), "symbol")
    then = values(query(prometheus.base, f"sum by (symbol) (avg_over_time({window} offset {OFFSET}s))", at), "symbol")
    assert HOT in now and HOT in then
    change = values(query(prometheus.base, grafanadash.interpolate(changed, picked), at), "symbol")
    assert change[HOT] == pytest.approx(now[HOT] - then[HOT], abs=1e-9)


def test_the_dashboards_variables_list_the_fleet(prometheus: Prometheus) -> None:
    dashboard = grafanadash.load(DASHBOARD)
    variables = grafanadash.variables(dashboard)
    picked = dashboard_values(dashboard, ".+")
    wait_history(prometheus, 3 * SCRAPE_S)
    listed = {}
    for name in ("job", "host"):
        selector, label = grafanadash.label_values(grafanadash.interpolate(variables[name]["query"]["query"], picked))
        listed[name] = set(api(prometheus.base, f"label/{label}/values", **{"match[]": selector}))
    assert listed == {"job": {"optrace"}, "host": set(HOSTS)}


def test_the_dashboard_is_well_formed() -> None:
    """What Grafana would trip on: a panel of another data source, an undefined variable, ids used twice,
    panels on top of each other."""
    dashboard = grafanadash.load(DASHBOARD)
    panels = dashboard["panels"]
    defined = set(grafanadash.variables(dashboard)) | {"__range", "__rate_interval", "__interval"}
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert all(target["datasource"] == panel["datasource"] for target in panel["targets"])
        used = grafanadash.names_used(" ".join([panel["title"], *(target["expr"] for target in panel["targets"])]))
        assert used <= defined, panel["title"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells = [(panel["gridPos"]["x"] + dx, panel["gridPos"]["y"] + dy) for panel in panels
             for dx in range(panel["gridPos"]["w"]) for dy in range(panel["gridPos"]["h"])]
    assert len(cells) == len(set(cells)) and all(0 <= x < 24 for x, _ in cells)


def docs_queries() -> list[str]:
    """docs/fleet.md's PromQL blocks, then the README's PromQL over the recorded series."""
    readme = re.findall(rf"`([^`]*{re.escape(CPU_RULE)}[^`]*)`", (REPO / "README.md").read_text())
    return re.findall(r"```promql\n(.*?)```", DOC.read_text(), re.DOTALL) + readme


def test_every_query_of_the_docs_returns_data(prometheus: Prometheus) -> None:
    shown = docs_queries()
    assert len(shown) >= 6
    at = wait_history(prometheus, HISTORY)
    answers = []
    for promql in shown:
        shortened = promql.replace("[1h]", f"[{WINDOW}s]").replace("offset 1d", f"offset {OFFSET}s")
        answers.append(query(prometheus.base, shortened, at))
        assert answers[-1], f"no data for {shortened}"
    top_functions, hosts_running, _, hottest_per_host = answers[:4]
    assert max(top_functions, key=lambda row: float(row["value"][1]))["metric"]["symbol"] == HOT
    assert set(values(hosts_running, "instance")) == set(HOSTS)
    shares = {row["metric"]["instance"]: (row["metric"]["symbol"], float(row["value"][1])) for row in hottest_per_host}
    assert shares.keys() == set(HOSTS) and all(symbol == HOT and 0.3 < share < 0.5 for symbol, share in
                                               shares.values()), shares


def pods(fleet: Fleet) -> list[dict]:
    """Target groups as Kubernetes pod discovery would make them: optrace's DaemonSet pods on node-1..3
    (their declared port 1: only the annotation's port reaches the agent), and a pod not to scrape."""
    groups = []
    for number, agent in enumerate(fleet.agents, 1):
        groups.append({"targets": [f"{agent.host}:1"], "labels": {
            "__meta_kubernetes_namespace": "monitoring",
            "__meta_kubernetes_pod_name": f"optrace-{number}",
            "__meta_kubernetes_pod_node_name": f"node-{number}",
            "__meta_kubernetes_pod_ip": agent.host,
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
            "__meta_kubernetes_pod_annotation_prometheus_io_port": agent.target.rsplit(":", 1)[1],
            "__meta_kubernetes_pod_label_" + re.sub(r"[./]", "_", K8S_LABEL): "optrace"}})
    groups.append({"targets": ["127.0.0.5:1"], "labels": {
        "__meta_kubernetes_namespace": "monitoring", "__meta_kubernetes_pod_name": "optrace-off",
        "__meta_kubernetes_pod_ip": "127.0.0.5", "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "false"}})
    return groups


def test_the_kubernetes_job_scrapes_each_node(fleet: Fleet, tmp_path: Path) -> None:
    config = prometheus_config(FLEET / "prometheus-kubernetes.yml", tmp_path, pods(fleet))
    nodes = {f"node-{number}": agent for number, agent in enumerate(fleet.agents, 1)}
    with running_prometheus(config, tmp_path / "data") as k8s:
        def all_up() -> dict | None:
            targets = api(k8s.base, "targets")
            up = [t for t in targets["activeTargets"] if t["health"] == "up"]
            return targets if len(up) == len(nodes) else None

        targets = wait_for(all_up, 30, "the three pods' agents scraped")
        scraped = {t["labels"]["instance"]: t for t in targets["activeTargets"]}
        assert {node: t["scrapeUrl"] for node, t in scraped.items()} == {
            node: f"{agent.base}/metrics" for node, agent in nodes.items()}
        assert all(t["labels"]["namespace"] == "monitoring" and t["labels"]["pod"] == f"optrace-{node[-1]}"
                   for node, t in scraped.items())
        assert [t["discoveredLabels"]["__meta_kubernetes_pod_name"] for t in targets["droppedTargets"]] == \
            ["optrace-off"]
        hot = f'sum by (instance) ({CPU_RULE}{{symbol="{HOT}"}})'
        wait_for(lambda: set(values(query(k8s.base, hot), "instance")) == set(nodes), 30,
                 "the rule's series of each node")
