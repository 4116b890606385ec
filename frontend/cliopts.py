"""Options several commands share, spelled the way perf users type them.

One place for each: the pid list (`-p 1,2` or `-p 1 -p 2` in record, count, serve and report), and perf's
report spellings (`--sort sym`, `--percent-limit 1%`, `-g`/`--call-graph` forms) so that every command
that takes them parses them alike.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from optrace.frontend.target import parse_pids


def _pid_values(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(parse_pids(values))


def pid_option(*names: str, help: str) -> Callable[[Any], Any]:
    """A repeatable pid option that also takes comma lists; the command gets a tuple of ints."""
    return click.option(*names, "pids", multiple=True, metavar="PID[,PID...]", callback=_pid_values, help=help)
