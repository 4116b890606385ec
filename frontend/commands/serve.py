"""`optrace serve`: a Prometheus scrape endpoint with a continuous CPU profile and uprobe call counts."""
from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from optrace.exporters.daemon import DEFAULT_MAX_SERIES, DEFAULT_PORT
from optrace.frontend.serveconfig import SETTING_TYPES, build_options, load_config_file

def merged_settings(ctx: click.Context, config: str | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The config file's settings, overridden by every flag given on the command line."""
    settings = load_config_file(config) if config else {}
    for key in SETTING_TYPES:  # flags are named like the config keys
        if ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE:
            value = flags[key]
            settings[key] = list(value) if isinstance(value, tuple) else value
    return settings


@click.command()
@click.option("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True, metavar="HOST:PORT",
              help="Address to serve /metrics on.")
@click.option("-F", "--freq", "frequency", type=int, default=99, show_default=True, help="Samples per second per CPU.")
@click.option("--uprobe", "uprobes", multiple=True, metavar="SPEC", help="Count calls of SPEC (see optrace count).")
@click.option("-p", "--pid", "pids", multiple=True, help="Profile only these processes and their children.")
@click.option("--comm", "comms", multiple=True, metavar="NAME", help="Keep only samples and calls of this command name.")
@click.option("--max-series", type=int, default=DEFAULT_MAX_SERIES, show_default=True,
              help="Series per metric; the rest is counted in [other] series.")
@click.option("--config", type=click.Path(dir_okay=False), help="YAML or TOML file with the same settings.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="Serve HTTPS with this certificate (PEM).")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="Private key of --tls-cert (PEM).")
@click.pass_context
def command(ctx: click.Context, config: str | None, **flags: Any) -> None:
    """Serve a continuous profile and call counts to Prometheus until SIGTERM or Ctrl-C."""
    options = build_options(merged_settings(ctx, config, flags))
    from optrace.exporters.daemon import ServeDaemon
    from optrace.frontend.doctor import require_recording
    from optrace.frontend.stopsignals import StopSignals

    require_recording(uprobes=bool(options.uprobes))
    daemon = ServeDaemon(options, on_warning=lambda message: click.echo(f"optrace: warning: {message}", err=True))
    with StopSignals() as stop:
        daemon.run(stop, on_ready=lambda url: click.echo(f"optrace: serving {url} (Ctrl-C or SIGTERM to stop)", err=True))
