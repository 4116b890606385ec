"""Generate optrace's man pages and shell completions from the CLI itself (click's command objects), so
they cannot drift from the options: `make setup` runs it and installs the output.

    python scripts/cli_docs.py OUTDIR     writes OUTDIR/man/optrace*.1 and OUTDIR/completion/{bash,zsh,fish}
"""
from __future__ import annotations

import datetime
import inspect
import os
import subprocess
import sys
from pathlib import Path

import click

from optrace import __version__
from optrace.frontend.cli import COMMANDS, cli

SHELLS = {"bash": "optrace", "zsh": "_optrace", "fish": "optrace.fish"}


def walk(command: click.Command, path: tuple[str, ...], ctx: click.Context | None = None):
    """(command path, command, context) for the group and every subcommand, depth first."""
    ctx = click.Context(command, info_name=path[-1], parent=ctx)
    yield path, command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from walk(sub, (*path, name), ctx)


def roff(text: str) -> str:
    """Plain text as roff: backslashes and leading dots/quotes escaped."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line[:1] in (".", "'") else line for line in text.splitlines())


def man_page(path: tuple[str, ...], command: click.Command, ctx: click.Context) -> str:
    name = "-".join(path)
    if len(path) == 1:
        summary = "eBPF CPU profiles and exact call counts, with JIT symbols"
    elif len(path) == 2 and path[1] in COMMANDS:
        summary = COMMANDS[path[1]][1]
    else:
        summary = command.get_short_help_str(80)
    epoch = os.environ.get("SOURCE_DATE_EPOCH")  # reproducible builds
    today = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).date() if epoch else \
        datetime.date.today()
    lines = [f'.TH {name.upper()} 1 "{today:%Y-%m-%d}" "optrace {__version__}" "optrace manual"',
             ".SH NAME", f"{roff(name)} \\- {roff(summary)}",
             ".SH SYNOPSIS", f".B {roff(' '.join(path))}", roff(" ".join(command.collect_usage_pieces(ctx)))]
    if command.help:
        paragraphs = inspect.cleandoc(click.unstyle(command.help)).replace("\b\n", "").split("\n\n")
        lines += [".SH DESCRIPTION", "\n.PP\n".join(roff(p) for p in paragraphs)]
    options = [param for param in command.get_params(ctx) if isinstance(param, click.Option) and not param.hidden]
    if options:
        lines.append(".SH OPTIONS")
        for option in options:
            record = option.get_help_record(ctx)
            if record:
                lines += [".TP", f".B {roff(record[0])}", roff(record[1] or "")]
    if isinstance(command, click.Group):
        lines.append(".SH COMMANDS")
        for sub in command.list_commands(ctx):
            lines += [".TP", f".B {roff(sub)}", f"See \\fB{'-'.join((*path, sub))}\\fR(1)."]
    lines += [".SH SEE ALSO", ", ".join(f"\\fB{'-'.join(p)}\\fR(1)" for p, _, _ in walk(cli, ("optrace",))
                                         if p != path)]
    return "\n".join(lines) + "\n"


def completion(shell: str) -> str:
    """click's own completion script for `optrace` (what `_OPTRACE_COMPLETE=<shell>_source optrace` prints)."""
    env = {**os.environ, "_OPTRACE_COMPLETE": f"{shell}_source"}
    optrace = Path(sys.executable).parent / "optrace"
    return subprocess.run([str(optrace)], env=env, capture_output=True, text=True, check=True).stdout


def main(outdir: str) -> None:
    man = Path(outdir) / "man"
    comp = Path(outdir) / "completion"
    man.mkdir(parents=True, exist_ok=True)
    comp.mkdir(parents=True, exist_ok=True)
    for path, command, ctx in walk(cli, ("optrace",)):
        (man / f"{'-'.join(path)}.1").write_text(man_page(path, command, ctx))
    for shell, filename in SHELLS.items():
        (comp / filename).write_text(completion(shell))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/cli")
