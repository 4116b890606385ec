"""`optrace serve` settings: from flags, from a config file (YAML or TOML), or both (flags win).

A config file holds the same settings as the flags, under these keys::

    listen = "127.0.0.1:9469"        # HOST:PORT, [IPv6]:PORT; port 0 picks a free port
    frequency = 99                   # -F
    uprobes = ["c:malloc"]           # --uprobe
    pids = [1234]                    # -p
    comms = ["nginx"]                # --comm
    max_series = 10000               # --max-series
    series_idle_expiry = 600         # --series-idle-expiry: seconds; 0 keeps series forever
    web_config = "/etc/optrace/web.yml"  # --web-config: TLS and basic auth, exporter-toolkit format
    tls_cert = "/etc/optrace/cert.pem"   # --tls-cert/--tls-key: TLS without a web config
    tls_key = "/etc/optrace/key.pem"
    call_graph = "dwarf"             # --call-graph: dwarf (CFI unwinding in BPF) or fp
    python = true                    # --python on|off: Python functions in place of the interpreter's frames
    python_internals = false         # --python-internals: the interpreter's own frames, not folded into Python's
    otlp_endpoint = "http://collector:4317"  # --otlp-endpoint: OTLP push, and the otlp_* keys of
                                     # frontend/serve/otlpconfig.py (each also from OTEL_* variables)

Every value is checked here, so a bad file or flag is one clear line before any BPF is loaded. The
same checks run again when serve reloads (SIGHUP), except that -p processes may have exited by then.
"""
from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from optrace.defaults import CALL_GRAPHS
from optrace.errors import OptraceError
from optrace.kernel import COMM_MAX
from optrace.frontend.cliopts import check_frequency
from optrace.frontend.serve.cardinality import MIN_SERIES
from optrace.frontend.serve.httpserver import ListenAddress
from optrace.frontend.serve.otlpconfig import OTLP_SETTING_TYPES, otlp_options
from optrace.frontend.serve.options import DEFAULT_PORT, ServeOptions
from optrace.frontend.serve.settingsfile import read_settings, require_settings
from optrace.frontend.serve.webconfig import TlsFiles, WebConfig, load_web_config, tls_context
from optrace.frontend.session import check_off_cpu_every
from optrace.frontend.target import check_pids, parse_pids
from optrace.frontend.uprobes.spec import parse_spec

SETTING_TYPES: dict[str, type] = {
    "listen": str,
    "frequency": int,
    "uprobes": list,
    "pids": list,
    "subprocesses": bool,
    "comms": list,
    "max_series": int,
    "series_idle_expiry": int,
    "web_config": str,
    "tls_cert": str,
    "tls_key": str,
    "off_cpu": bool,
    "off_cpu_every": int,
    "call_graph": str,
    "python": bool,
    "python_internals": bool,
    **OTLP_SETTING_TYPES,
}

TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", bool: "true or false"}


def load_config_file(path: str) -> dict[str, Any]:
    """The settings in a .yaml/.yml or .toml file, type-checked (values are checked by build_options)."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise OptraceError(f"config {path}: unknown format: name it .yaml, .yml or .toml")
    data = read_settings(path, "config")
    try:
        settings = tomllib.loads(data.decode()) if suffix == ".toml" else yaml.safe_load(data)
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OptraceError(f"config {path}: not valid {suffix[1:].upper()}: {first_line}") from None
    require_settings(settings, path, "config", "leave out --config for the defaults")
    return check_setting_types(settings, path)


def check_setting_types(settings: object, path: str) -> dict[str, Any]:
    if not isinstance(settings, dict):
        raise OptraceError(f"config {path}: expected a mapping of settings at the top level")
    for key, value in settings.items():
        expected = SETTING_TYPES.get(key)
        if expected is None:
            raise OptraceError(f"config {path}: unknown setting {key!r} (known: {', '.join(SETTING_TYPES)})")
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise OptraceError(f"config {path}: {key} must be {TYPE_NAMES[expected]}, not {value!r}")
    return settings


def parse_listen(text: str) -> ListenAddress:
    """HOST:PORT or [IPV6]:PORT; an empty host means every interface."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise OptraceError(f"bad listen address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return ListenAddress(host or "0.0.0.0", int(port))


def web_settings(web_config: str | None, cert: str | None, key: str | None) -> WebConfig:
    """The web config file's settings, or TLS from --tls-cert/--tls-key (not both)."""
    if (cert or key) and not (cert and key):
        raise OptraceError("TLS needs both --tls-cert and --tls-key")
    web = load_web_config(web_config) if web_config else WebConfig()
    if cert and key:
        if web.tls is not None:
            raise OptraceError(f"TLS is set both in --web-config {web_config} and by --tls-cert/--tls-key: keep one")
        web = WebConfig(TlsFiles(cert, key), web.headers, web.users)
    return web


def off_cpu_every(every: int, off_cpu: bool) -> int:
    if every != 1 and not off_cpu:
        raise OptraceError("--off-cpu-every needs --off-cpu")
    check_off_cpu_every(every)
    return every


def build_options(settings: dict[str, Any], reloading: bool = False,
                  environ: Mapping[str, str] = os.environ) -> ServeOptions:
    """Validated ServeOptions from merged settings (keys as in SETTING_TYPES) and, for what the flags and
    the file leave unset, the OTEL_* variables of ``environ``."""
    options = ServeOptions()
    if "listen" in settings:
        options.listen = parse_listen(settings["listen"])
    options.frequency_hz = settings.get("frequency", options.frequency_hz)
    check_frequency(options.frequency_hz)
    options.pids = parse_pids(tuple(str(p) for p in settings.get("pids", [])))
    if not reloading:
        check_pids(options.pids)
    options.subprocesses = settings.get("subprocesses", False)
    if options.subprocesses and not options.pids:
        raise OptraceError("--subprocesses goes with -p PID (pids in the config file)")
    options.uprobes = [str(s) for s in settings.get("uprobes", [])]
    for spec in options.uprobes:
        parse_spec(spec)
    options.comms = [str(c) for c in settings.get("comms", [])]
    for comm in options.comms:
        if not 0 < len(comm.encode()) <= COMM_MAX:
            raise OptraceError(f"bad --comm {comm!r}: the kernel keeps 1 to {COMM_MAX} bytes of a command name")
    options.max_series = settings.get("max_series", options.max_series)
    if options.max_series < MIN_SERIES:
        raise OptraceError(f"--max-series must be at least {MIN_SERIES}")
    options.series_idle_s = settings.get("series_idle_expiry", options.series_idle_s)
    if options.series_idle_s < 0:
        raise OptraceError("--series-idle-expiry must be 0 (never) or a number of seconds")
    options.off_cpu = settings.get("off_cpu", False)
    options.off_cpu_every = off_cpu_every(settings.get("off_cpu_every", 1), options.off_cpu)
    options.call_graph = settings.get("call_graph", options.call_graph)
    if options.call_graph not in CALL_GRAPHS:
        raise OptraceError(f"bad call_graph {options.call_graph!r}: expected {' or '.join(CALL_GRAPHS)}")
    options.python = settings.get("python", options.python)
    options.python_internals = settings.get("python_internals", options.python_internals)
    options.web = web_settings(settings.get("web_config"), settings.get("tls_cert"), settings.get("tls_key"))
    if options.web.tls is not None:
        tls_context(options.web.tls)  # unusable files fail here, not after the BPF compile
    options.otlp = otlp_options(settings, environ)
    return options
