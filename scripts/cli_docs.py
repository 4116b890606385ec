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
# A man page's EXAMPLES: (command line, what it does), per command path. tests/test_cli_docs.py checks that
# every page has some and that every command and option they show exists in the CLI.
EXAMPLES: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {
    ("optrace",): (
        ("sudo optrace record -- ./app", "Profile ./app and its children until it exits; writes optrace.data."),
        ("optrace report", "Print optrace.data per symbol, like perf report (no root needed)."),
        ("optrace doctor", "Say what this machine lacks for recording, and how to fix it."),
    ),
    ("optrace", "record"): (
        ("sudo optrace record -F 499 -o demo.data -- workloads/build/demo 2",
         "Profile a command at 499 Hz into demo.data."),
        ("sudo optrace record -p 1234 -d 30", "Profile a running process (and the children it starts) for 30 s."),
        ("sudo optrace record -p 1234 --subprocesses -d 10",
         "A pre-fork server's master and the workers it has now (gunicorn, uWSGI) for 10 s."),
        ("sudo optrace record -a -d 10 --call-graph fp", "The whole machine for 10 s, walking frame pointers only."),
        ("sudo optrace record --off-cpu -- ./server", "CPU samples and where threads waited off CPU."),
        ("sudo optrace record -e cpu-clock --call-graph dwarf,16384 -g -- ./app",
         "perf's command line as it is: -e cpu-clock and dwarf,SIZE are taken (SIZE is checked and unused)."),
        ("sudo optrace record -v -- ./app", "Also say which BPF programs were loaded stored and which compiled."),
    ),
    ("optrace", "report"): (
        ("optrace report -i demo.data --percent-limit 1", "The profile per symbol, rows under 1 % hidden."),
        ("optrace report -G caller", "The call graph from main down."),
        ("optrace report -i off.data --event off-cpu --gil", "Which Python code waited for the GIL, and how long."),
        ("optrace report --format flamegraph -o flame.html", "An interactive flame graph (HTML)."),
        ("optrace report --format pprof -o cpu.pb.gz", "A profile for go tool pprof, Pyroscope or Parca."),
        ("optrace report -i py.data --python-internals",
         "A Python program's CPython frames (PyObject_Free...) as recorded, not counted as its Python functions'."),
    ),
    ("optrace", "diff"): (
        ("optrace diff base.data new.data --percent-limit 1", "Each row's share in both records and the change."),
        ("optrace diff base.data new.data --format flamegraph -o diff.html", "A differential flame graph."),
    ),
    ("optrace", "annotate"): (
        ("optrace annotate -i demo.data", "The functions the record kept code for, with their samples."),
        ("optrace annotate -i demo.data hot_a", "hot_a's instructions, each with its share of hot_a's samples."),
        ("optrace annotate -i py.data Template.render",
         "A Python function's source lines, each with the samples under it (its callees') and its own."),
    ),
    ("optrace", "top"): (
        ("sudo optrace top", "The hottest functions of the whole machine, refreshed every second (q quits)."),
        ("sudo optrace top --stdio -p 1234 -d 3 -n 2", "Two plain tables of one process, three seconds apart."),
        ("sudo optrace top -p 1234 --subprocesses", "A process and its descendants, the ones it has now included."),
    ),
    ("optrace", "doctor"): (
        ("optrace doctor", "Every check with ok, warn or FAIL, and the fix of each failure."),
    ),
    ("optrace", "count"): (
        ("sudo optrace count c:malloc -d 5", "Exact calls of libc's malloc in every process for 5 s."),
        ("sudo optrace count ./app:parse -- ./app input", "Calls of parse in ./app and its children while it runs."),
        ("sudo optrace count 'c:str*' -i 1 --per-pid", "Every libc str* function, per process, each second."),
    ),
    ("optrace", "serve"): (
        ("sudo optrace serve", "A Prometheus target on 127.0.0.1:9469: the whole machine's profile at 99 Hz."),
        ("sudo optrace serve --listen 0.0.0.0:9469 --uprobe c:malloc", "Scraped from elsewhere, with malloc's calls."),
        ("sudo optrace serve --config /etc/optrace/serve.yaml", "The settings from a file (SIGHUP re-reads it)."),
    ),
    ("optrace", "jit"): (
        ("optrace jit show /tmp/perf-1234.map", "List a perf map: address, size, name, replacements."),
        ("optrace jit convert jit-1234.dump", "Write jit-1234.elf from a jitdump."),
    ),
    ("optrace", "jit", "show"): (
        ("optrace jit show /tmp/perf-1234.map", "List a perf map: address, size, name, replacements."),
        ("optrace jit show jit-1234.dump", "List a jitdump's records: loads, moves, debug info."),
    ),
    ("optrace", "jit", "convert"): (
        ("optrace jit convert jit-1234.dump -o app-jit.elf", "An ELF file with the JIT code, its symbols and a build-id."),
        ("optrace jit convert /tmp/perf-1234.map", "The same from a perf map (symbols only, no code)."),
    ),
}


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
    if path in EXAMPLES:
        lines.append(".SH EXAMPLES")
        for example, what in EXAMPLES[path]:
            lines += [".TP", f".B {roff(example)}", roff(what)]
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
