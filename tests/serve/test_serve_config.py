"""`optrace serve` settings: flags and config files (YAML, TOML), and one clear line for each bad input."""
from __future__ import annotations

import pytest

from optrace.frontend.serve.options import DEFAULT_PORT, ServeOptions
from optrace.frontend.serve.httpserver import ListenAddress, TlsFiles, WebConfig
from optrace.frontend.serve.config import build_options, load_config_file

YAML = """
listen: "[::1]:9555"
frequency: 49
uprobes: ["c:malloc", "c:free"]
comms: [nginx]
max_series: 500
series_idle_expiry: 90
call_graph: fp
python: false
off_cpu: true
off_cpu_every: 16
tls_cert: {cert}
tls_key: {key}
"""
TOML = """
listen = "[::1]:9555"
frequency = 49
uprobes = ["c:malloc", "c:free"]
comms = ["nginx"]
max_series = 500
series_idle_expiry = 90
call_graph = "fp"
python = false
off_cpu = true
off_cpu_every = 16
tls_cert = "{cert}"
tls_key = "{key}"
"""


@pytest.fixture
def pem_files(tmp_path) -> tuple[str, str]:
    """A certificate and key that are not PEM at all."""
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    return str(cert), str(key)


def test_yaml_and_toml_hold_the_same_settings(tmp_path, self_signed):
    cert, key = self_signed.cert, self_signed.key
    (tmp_path / "a.yaml").write_text(YAML.format(cert=cert, key=key))
    (tmp_path / "a.toml").write_text(TOML.format(cert=cert, key=key))
    expected = ServeOptions(listen=ListenAddress("::1", 9555), frequency_hz=49, uprobes=["c:malloc", "c:free"],
                            comms=["nginx"], max_series=500, series_idle_s=90, web=WebConfig(TlsFiles(cert, key)),
                            call_graph="fp", off_cpu=True, off_cpu_every=16, python=False)
    assert build_options(load_config_file(str(tmp_path / "a.yaml"))) == expected
    assert build_options(load_config_file(str(tmp_path / "a.toml"))) == expected


def test_defaults_listen_on_loopback_only():
    options = build_options({})
    assert options.listen == ListenAddress("127.0.0.1", DEFAULT_PORT) and options.web == WebConfig()
    assert options.series_idle_s == 600 and options.call_graph == "dwarf" and options.python


def test_flags_override_the_config_file(tmp_path, optrace):
    config = tmp_path / "serve.yaml"
    config.write_text("listen: 'nonsense'\nmax_series: 2\n")
    result = optrace("serve", "--config", str(config))
    assert result.stderr == "optrace: bad listen address 'nonsense': expected HOST:PORT, e.g. 127.0.0.1:9469\n"
    result = optrace("serve", "--config", str(config), "--listen", "127.0.0.1:1")
    assert result.stderr == "optrace: --max-series must be at least 3\n"  # the flag's listen was taken


@pytest.mark.parametrize("config_text, suffix, message", [
    ("listen: [1, 2\n", ".yaml", "not valid YAML"),
    ("listen = \n", ".toml", "not valid TOML"),
    ("- 1\n- 2\n", ".yaml", "expected a mapping of settings"),
    ("port: 1\n", ".yaml", "unknown setting 'port' (known: listen, frequency"),
    ("frequency: fast\n", ".yaml", "frequency must be an integer, not 'fast'"),
    ("max_series: true\n", ".yaml", "max_series must be an integer"),
    ("call_graph: lbr\n", ".yaml", "bad call_graph 'lbr': expected dwarf or fp"),
    ("listen = 1\n", ".ini", "unknown format: name it .yaml, .yml or .toml"),
])
def test_bad_config_files(tmp_path, optrace, config_text, suffix, message):
    config = tmp_path / f"serve{suffix}"
    config.write_text(config_text)
    result = optrace("serve", "--config", str(config))
    assert result.returncode != 0
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--listen", "localhost"], "bad listen address 'localhost'"),
    (["--listen", "127.0.0.1:70000"], "bad listen address"),
    pytest.param(["--listen", "no.such.host.invalid:9469"], "cannot listen on no.such.host.invalid:9469",
                 marks=pytest.mark.root),  # as another user serve stops first at "needs root"
    (["--max-series", "2"], "--max-series must be at least 3"),
    (["--call-graph", "lbr"], "'lbr' is not one of dwarf, dwarf,SIZE or fp"),
    (["-F", "0"], "frequency 0 Hz is out of range"),
    (["-p", "999999999"], "no such process: 999999999"),
    (["-p", "abc"], "not a process id: 'abc'"),
    (["--uprobe", "malloc"], "bad probe 'malloc'"),
    (["--comm", "a-name-longer-than-15"], "the kernel keeps 1 to 15 bytes"),
    (["--tls-cert", "/etc/hostname"], "TLS needs both --tls-cert and --tls-key"),
    (["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"], "cannot read TLS file /nonexistent.pem"),
    (["--config", "/nonexistent.yaml"], "cannot read config /nonexistent.yaml"),
    (["--config", "/dev/null"], "unknown format"),
    (["--config", "/proc/self/status.yaml"], "cannot read config /proc/self/status.yaml"),
    (["--series-idle-expiry", "-1"], "--series-idle-expiry must be 0 (never) or a number of seconds"),
    (["--off-cpu-every", "4"], "--off-cpu-every needs --off-cpu"),
    (["--off-cpu", "--off-cpu-every", "0"], "--off-cpu-every takes 1..1000000"),
    (["--series-idle-expiry", "soon"], "'soon' is not a valid integer"),
    (["--web-config", "/nonexistent.yml"], "cannot read web config /nonexistent.yml: it does not exist"),
    (["--web-config", "/"], "File '/' is a directory"),
])
def test_bad_flags(optrace, args, message):
    result = optrace("serve", *args, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("name, text, mode, message", [
    ("empty.yaml", "", 0o644, "config {path} has no settings (empty, or only comments): leave out --config"),
    ("comments.toml", "# listen = '0.0.0.0:9469'\n", 0o644, "config {path} has no settings"),
    ("open.yaml", "frequency: 49\n", 0o666, "cannot read config {path}: is writable by other users (mode 0666)"),
])
def test_a_config_file_without_settings_or_that_others_can_write_is_refused(tmp_path, optrace, name, text, mode, message):
    """It names the web config (basic auth, TLS): another user must not be able to change it, and a truncated
    one must not drop it."""
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    result = optrace("serve", "--config", str(path), timeout=60)
    assert result.returncode == 1 and result.stderr.startswith(f"optrace: {message.format(path=path)}")
    assert result.stderr.count("\n") == 1


def test_bad_tls_files_fail_before_bpf_loads(tmp_path, optrace, pem_files):
    cert, key = pem_files
    result = optrace("serve", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, timeout=60)
    assert result.returncode != 0
    assert result.stderr.startswith(f"optrace: cannot use TLS certificate {cert} with key {key}")
