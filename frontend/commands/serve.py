"""`optrace serve`: a Prometheus scrape endpoint with a continuous CPU profile and uprobe call counts."""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from optrace.frontend.serve.options import DEFAULT_MAX_SERIES, DEFAULT_PORT, SERVE_CALL_GRAPH
from optrace.frontend.serve.totals import DEFAULT_SERIES_IDLE_S
from optrace.frontend.cliopts import (frequency_option, pid_option, python_internals_option, python_option,
                                      subprocesses_option, unwind_option)
from optrace.frontend.serve.config import SETTING_TYPES, build_options, load_config_file
from optrace.frontend.serve.otlpconfig import DEFAULT_INTERVAL_S, DEFAULT_QUEUE_BYTES, PROTOCOLS
from optrace.heap import large_blocks_mapped, one_arena


def merged_settings(ctx: click.Context, config: str | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The config file's settings, overridden by every flag given on the command line."""
    settings = load_config_file(config) if config else {}
    for key in SETTING_TYPES:  # flags are named like the config keys
        if ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE:
            value = flags[key]
            settings[key] = list(value) if isinstance(value, tuple) else value
    return settings


def say(message: str) -> None:
    """One line on stderr; a closed stderr (the terminal hung up) does not stop the daemon."""
    try:
        click.echo(f"optrace: {message}", err=True)
    except OSError:
        pass


def otlp_flags(command: Callable[..., None]) -> Callable[..., None]:
    """The OTLP push flags: each also a config key and an OTEL_* variable (frontend/serve/otlpconfig.py)."""
    flags = [
        click.option("--otlp-endpoint", metavar="URL", help="Push OTLP profiles here (as OTEL_EXPORTER_OTLP_ENDPOINT: "
                     "http/protobuf appends /v1development/profiles)."),
        click.option("--otlp-profiles-endpoint", metavar="URL", help="The same, used as it is "
                     "(OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT)."),
        click.option("--otlp-protocol", type=click.Choice(PROTOCOLS), help="Default grpc."),
        click.option("--otlp-headers", metavar="K=V,...", help="Headers of every request (values %-encoded)."),
        click.option("--otlp-certificate", metavar="PEM", help="CA to verify the OTLP server with."),
        click.option("--otlp-client-key", metavar="PEM", help="mTLS: the client's key."),
        click.option("--otlp-client-certificate", metavar="PEM", help="mTLS: the client's certificate."),
        click.option("--otlp-insecure", is_flag=True, help="gRPC endpoint without a scheme: no TLS."),
        click.option("--otlp-compression", type=click.Choice(("gzip", "none")), help="Default gzip."),
        click.option("--otlp-timeout", type=int, metavar="SECONDS", help="Per request (default 10; 0: none)."),
        click.option("--otlp-interval", type=int, metavar="SECONDS",
                     help=f"One profile per this many seconds (default {DEFAULT_INTERVAL_S})."),
        click.option("--otlp-queue-bytes", type=int, metavar="BYTES",
                     help=f"Requests held while the backend is slow or down (default {DEFAULT_QUEUE_BYTES >> 20} MiB; "
                          "the oldest are dropped)."),
        click.option("--service-name", metavar="NAME", help="service.name of every resource (OTEL_SERVICE_NAME)."),
        click.option("--resource-attributes", metavar="K=V,...", help="Added to every resource "
                     "(OTEL_RESOURCE_ATTRIBUTES)."),
    ]
    for flag in reversed(flags):
        command = flag(command)
    return command


@click.command()
@click.option("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True, metavar="HOST:PORT",
              help="Address to serve /metrics on.")
@frequency_option()
@click.option("--uprobe", "uprobes", multiple=True, metavar="SPEC", help="Count calls of SPEC (see optrace count).")
@pid_option("-p", "--pid", help="Profile only these processes and their children (repeat, or comma list).")
@subprocesses_option()
@click.option("--comm", "comms", multiple=True, metavar="NAME", help="Keep only samples and calls of this command name.")
@click.option("--max-series", type=int, default=DEFAULT_MAX_SERIES, show_default=True,
              help="Series per metric; the rest is counted in [other] series.")
@click.option("--series-idle-expiry", type=int, default=int(DEFAULT_SERIES_IDLE_S), show_default=True,
              metavar="SECONDS", help="Drop a series that has not moved for this long (0: never); "
                                      "if it comes back it starts again from 0 (a counter reset).")
@unwind_option(default=SERVE_CALL_GRAPH)
@python_option()
@python_internals_option()
@click.option("--off-cpu", "off_cpu", is_flag=True,
              help="Also export optrace_offcpu_seconds_total: where threads wait off CPU.")
@click.option("--off-cpu-every", "off_cpu_every", type=int, default=1, show_default=True, metavar="N",
              help="With --off-cpu: record one wait in N (at random) and count it N times.")
@click.option("--config", type=click.Path(dir_okay=False), help="YAML or TOML file with the same settings.")
@click.option("--web-config", type=click.Path(dir_okay=False),
              help="TLS and basic auth (bcrypt) for /metrics: a Prometheus exporter-toolkit web config file.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="Serve HTTPS with this certificate (PEM).")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="Private key of --tls-cert (PEM).")
@otlp_flags
@click.pass_context
def command(ctx: click.Context, config: str | None, **flags: Any) -> None:
    """Serve a continuous profile and call counts to Prometheus until SIGTERM or Ctrl-C; with an OTLP
    endpoint (--otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT), also push a profile of whole stacks every
    interval.

    SIGHUP re-reads --config and --web-config (and TLS files): TLS, users, headers and the series
    idle time change at once; other settings need a restart."""
    reload_requested = threading.Event()
    signal.signal(signal.SIGHUP, lambda signum, frame: reload_requested.set())  # first: SIGHUP is never fatal
    one_arena()  # before any thread: serve runs for months (optrace/heap.py)
    large_blocks_mapped()
    options = build_options(merged_settings(ctx, config, flags))
    from optrace.frontend.serve.daemon import ServeDaemon
    from optrace.frontend.preflight import require_recording
    from optrace.frontend.serve.sources import build_sources
    from optrace.frontend.stopsignals import StopSignals

    require_recording(uprobes=bool(options.uprobes))
    daemon = ServeDaemon(options, build_sources(options), on_warning=lambda message: say(f"warning: {message}"), on_info=say,
                         reload=lambda: build_options(merged_settings(ctx, config, flags), reloading=True),
                         reload_requested=reload_requested, on_error=lambda message: say(f"error: {message}"))

    def ready(url: str) -> None:
        from optrace.frontend.cliopts import program_loads_line

        say(program_loads_line())
        say(f"serving {url} (Ctrl-C or SIGTERM to stop, SIGHUP to reload)")

    with StopSignals() as stop:
        daemon.run(stop, on_ready=ready)
