"""The `optrace` command: a click group whose subcommands live one per module in commands/.

Subcommands are imported only when invoked, so `optrace report` never loads BCC or the BPF side.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from optrace import __version__
from optrace.errors import OptraceError
from optrace.frontend.startpriority import raise_for_start

# name -> (module under optrace.frontend.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "record": ("record", "Record a CPU profile of a command, processes or the whole machine."),
    "report": ("report", "Show a recorded profile per symbol, like perf report."),
    "diff": ("diff", "Compare two recorded profiles per symbol, like perf diff."),
    "annotate": ("annotate", "Show a recorded function's instructions with their share of its samples."),
    "top": ("top", "Show the hottest functions now, refreshed live, like perf top."),
    "doctor": ("doctor", "Check that this machine can record, and say how to fix what is missing."),
    "count": ("count", "Count exact calls of user functions with uprobes."),
    "serve": ("serve", "Serve a continuous profile and call counts to Prometheus."),
    "jit": ("jit", "Inspect and convert JIT symbol files (perf maps, jitdumps)."),
}


SAMPLING_COMMANDS = ("record", "top", "serve", "count")  # started at a raised priority (frontend/startpriority.py)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        if name in SAMPLING_COMMANDS and not ctx.resilient_parsing:  # before its imports: they are its start too
            raise_for_start()
        module = importlib.import_module(f"optrace.frontend.commands.{COMMANDS[name][0]}")
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="optrace")
def cli() -> None:
    """optrace: eBPF CPU profiles and exact call counts, with JIT symbols."""


def main() -> None:
    """Entry point: every OptraceError becomes one line on stderr and a non-zero exit."""
    try:
        status = cli(standalone_mode=False)
    except OptraceError as exc:
        click.echo(f"optrace: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("optrace: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        where = f" (see {exc.ctx.command_path} --help)" if exc.ctx else ""
        click.echo(f"optrace: {exc.format_message()}{where}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"optrace: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(141)
    except Exception as exc:  # a bug, not bad input: still one line unless asked for more
        if os.environ.get("OPTRACE_DEBUG"):
            traceback.print_exc()
        click.echo(f"optrace: internal error: {exc!r} (set OPTRACE_DEBUG=1 for the traceback)", err=True)
        sys.exit(70)
    sys.exit(status if isinstance(status, int) else 0)
