"""Every file of docs/fleet checked without a fleet: the systemd unit by systemd-analyze, serve.yaml by serve's
own config reader, the Prometheus configs and rules by promtool (the rule's arithmetic by `promtool test
rules`), and the configs of what cannot be installed here (Parca, Grafana Alloy, the OpenTelemetry
Collector) read as YAML or Alloy syntax, with the keys and paths that must match serve checked against
serve's own constants. Their queries and scrape jobs run for real in test_fleet_prometheus.py."""
from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

import alloysyntax
import readmecheck
from fleetkit import FLEET, discovery_from_file
from optrace.frontend.cli import cli
from optrace.frontend.serve.config import build_options, load_config_file
from optrace.frontend.serve.routes import PROFILE_PATH
from optrace.frontend.serve.options import DEFAULT_PORT
from optrace.frontend.serve.profilewindows import MAX_SECONDS
from prometheusserver import promtool
from support import REPO

DOC = REPO / "docs" / "fleet.md"
UNIT = FLEET / "optrace.service"
OTLP_DROP_IN = FLEET / "optrace.service.d" / "otlp.conf"
OPTRACE = Path(sys.executable).parent / "optrace"
GO_RUNTIME_PROFILES = ("memory", "block", "goroutine", "mutex")  # what Parca and Alloy pull unless told not to
# The OTLP defaults of the OpenTelemetry specification, which serve follows (OTEL_EXPORTER_OTLP_*)
OTLP_GRPC_PORT, OTLP_HTTP_PORT = 4317, 4318
PROFILES_SIGNAL_GATE = "--feature-gates=service.profilesSupport"


def seconds(duration: str) -> int:
    """A Prometheus or Alloy duration of whole seconds or minutes: "15s", "1m"."""
    match = re.fullmatch(r"(\d+)([sm])", duration)
    assert match, duration
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def unit_entries(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(path.read_text())
    return parser


def systemd_analyze_verify(unit_text: str, folder: Path) -> subprocess.CompletedProcess:
    """systemd-analyze verify of the unit (its binary taken from this checkout: it is
    /opt/optrace/.venv/bin/optrace on a host) beside its OTLP drop-in."""
    folder.mkdir()
    (folder / "optrace.service").write_text(unit_text.replace("/opt/optrace/.venv/bin/optrace", str(OPTRACE)))
    shutil.copytree(OTLP_DROP_IN.parent, folder / OTLP_DROP_IN.parent.name)
    return subprocess.run(["systemd-analyze", "verify", str(folder / "optrace.service")], capture_output=True,
                          text=True, timeout=60)


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """Parsed, its command line checked against the CLI; then, where systemd-analyze is, verified with its
    drop-in without a single warning (and a misspelt key is one: the check can fail)."""
    unit = unit_entries(UNIT)
    command = unit["Service"]["ExecStart"].split()
    assert command[0] == "/opt/optrace/.venv/bin/optrace"
    assert readmecheck.cli_problem(cli, command[1:]) is None
    assert command[command.index("--config") + 1] == "/etc/optrace/serve.yaml"
    assert set(unit) >= {"Unit", "Service", "Install"} and unit["Install"]["WantedBy"] == "multi-user.target"
    assert list(unit_entries(OTLP_DROP_IN)) == ["DEFAULT", "Service"]
    if shutil.which("systemd-analyze") is None:
        return  # parsed only (systemd-analyze comes with systemd, on every Debian machine)
    proc = systemd_analyze_verify(UNIT.read_text(), tmp_path / "shipped")
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")
    proc = systemd_analyze_verify(UNIT.read_text().replace("Nice=", "Nicety="), tmp_path / "misspelt")
    assert "Unknown key 'Nicety'" in proc.stderr


def test_serve_yaml_is_read_by_serve() -> None:
    options = build_options(load_config_file(str(FLEET / "serve.yaml")))
    assert (options.listen.host, options.listen.port) == ("0.0.0.0", DEFAULT_PORT)
    assert options.call_graph == "dwarf" and not options.comms and not options.pids


def test_promtool_checks_the_prometheus_config_its_rules_and_targets() -> None:
    proc = promtool("check", "config", str(FLEET / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout and "1 rules found" in proc.stdout
    proc = promtool("check", "rules", str(FLEET / "optrace-rules.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_checks_the_target_files(tmp_path: Path) -> None:
    """promtool reads the file_sd files the config names: the shipped one passes, a broken copy does not."""
    config = yaml.safe_load((FLEET / "prometheus.yml").read_text())
    [pattern] = config["scrape_configs"][0]["file_sd_configs"][0]["files"]
    shipped = sorted(FLEET.glob(pattern))
    assert shipped == [FLEET / "targets" / "optrace-hosts.yml"]
    groups = yaml.safe_load(shipped[0].read_text())
    assert {target.rsplit(":", 1)[1] for group in groups for target in group["targets"]} == {str(DEFAULT_PORT)}
    shutil.copytree(FLEET, tmp_path / "fleet")
    broken = tmp_path / "fleet" / "targets" / "optrace-hosts.yml"
    broken.write_text(broken.read_text().replace("targets:", "targetz:", 1))
    proc = promtool("check", "config", str(tmp_path / "fleet" / "prometheus.yml"))
    assert proc.returncode != 0 and "targetz" in proc.stdout + proc.stderr


def test_promtool_checks_the_kubernetes_config(tmp_path: Path) -> None:
    """As shipped where promtool knows Kubernetes discovery; Debian's does not, so there everything but the
    discovery block is checked (the relabeling runs for real in test_fleet_prometheus.py)."""
    proc = promtool("check", "config", str(FLEET / "prometheus-kubernetes.yml"))
    if proc.returncode != 0 and "field kubernetes_sd_configs not found" in proc.stdout + proc.stderr:
        config = discovery_from_file(yaml.safe_load((FLEET / "prometheus-kubernetes.yml").read_text()),
                                     tmp_path / "pods.yml")
        (tmp_path / "pods.yml").write_text("[]\n")
        shutil.copy(FLEET / "optrace-rules.yml", tmp_path)
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        proc = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_tests_the_rule_in_cores() -> None:
    """The recorded series is cores whatever a host's -F (tests/fleet/optrace-rules.test.yml)."""
    proc = promtool("test", "rules", str(Path(__file__).with_name("optrace-rules.test.yml")))
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def prometheus_job(name: str = "prometheus.yml") -> dict:
    return yaml.safe_load((FLEET / name).read_text())["scrape_configs"][0]


def test_parca_pulls_serves_pprof_path_from_the_same_targets() -> None:
    [job] = yaml.safe_load((FLEET / "parca.yaml").read_text())["scrape_configs"]
    pprof = job["profiling_config"]["pprof_config"]
    assert pprof["process_cpu"] == {"enabled": True, "path": PROFILE_PATH, "delta": True}
    assert all(pprof[name] == {"enabled": False} for name in GO_RUNTIME_PROFILES)
    assert 1 <= seconds(job["scrape_interval"]) <= MAX_SECONDS  # the ?seconds= of a delta profile
    same = prometheus_job()
    assert job["relabel_configs"] == same["relabel_configs"]  # the same instance labels
    [files] = [sd["files"] for sd in job["file_sd_configs"]]
    assert files == [f"/etc/prometheus/{pattern}" for pattern in same["file_sd_configs"][0]["files"]]


def test_alloy_pulls_serves_pprof_path_from_the_same_targets() -> None:
    root = alloysyntax.parse((FLEET / "pyroscope.alloy").read_text())
    components = {f"{block.name}.{block.label}": block for block in root.blocks}
    assert set(components) == {"discovery.file.optrace", "discovery.relabel.optrace", "pyroscope.scrape.optrace",
                               "pyroscope.write.server"}
    scrape = components["pyroscope.scrape.optrace"]
    profiles = {block.name: block.attributes for block in scrape.block("profiling_config").blocks}
    assert profiles["profile.process_cpu"] == {"enabled": True, "path": PROFILE_PATH, "delta": True}
    assert all(profiles[f"profile.{name}"] == {"enabled": False} for name in GO_RUNTIME_PROFILES)
    delta, interval = (seconds(scrape.attributes[key]) for key in ("delta_profiling_duration", "scrape_interval"))
    assert 1 <= delta < interval and delta <= MAX_SECONDS
    references = [scrape.attributes["targets"], *scrape.attributes["forward_to"],
                  components["discovery.relabel.optrace"].attributes["targets"]]
    for reference in references:  # each names a component of the file and one of its exports
        component, export = reference.path.rsplit(".", 1)
        assert component in components and export in {"targets", "output", "receiver"}, reference
    files = components["discovery.file.optrace"].attributes["files"]
    assert files == [f"/etc/prometheus/{pattern}" for pattern in prometheus_job()["file_sd_configs"][0]["files"]]


def test_the_collector_receives_what_serve_sends() -> None:
    """The OTLP receiver listens where the unit's drop-in points serve (gRPC, 4317) and on OTLP/HTTP (4318);
    the profiles pipeline names only components the file declares; the feature gate is said."""
    config = yaml.safe_load((FLEET / "otel-collector.yaml").read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    environment = dict(line.removeprefix("Environment=").split("=", 1)
                       for line in OTLP_DROP_IN.read_text().splitlines() if line.startswith("Environment="))
    assert environment.keys() >= {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"}
    endpoint = urlsplit(environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert environment["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc" and endpoint.port == OTLP_GRPC_PORT
    assert protocols["grpc"]["endpoint"].rsplit(":", 1)[1] == str(endpoint.port)
    assert protocols["http"]["endpoint"].rsplit(":", 1)[1] == str(OTLP_HTTP_PORT)
    pipeline = config["service"]["pipelines"]["profiles"]
    assert pipeline["receivers"] == ["otlp"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline.get(kind, [])) <= set(config[kind]), kind
    text = (FLEET / "otel-collector.yaml").read_text()
    assert PROFILES_SIGNAL_GATE in text and PROFILES_SIGNAL_GATE in DOC.read_text()


def test_docs_show_every_file_as_it_is() -> None:
    """docs/fleet.md names every file of docs/fleet, and a block it marks as a file is that file, whole."""
    doc = DOC.read_text()
    files = sorted(path for path in FLEET.rglob("*") if path.is_file())
    assert files and all(f"fleet/{path.relative_to(FLEET)}" in doc for path in files)
    shown = re.findall(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```\n", doc, re.DOTALL)
    assert shown
    for name, block in shown:
        assert block == (REPO / "docs" / name).read_text(), name
