"""Options several commands share, spelled the way perf users type them.

One place for each: the pid list (`-p 1,2` or `-p 1 -p 2` in record, count, serve and report), and perf's
report spellings (`--sort sym`, `--percent-limit 1%`, `-g`/`--call-graph` forms) so that every command
that takes them parses them alike.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from optrace.errors import OptraceError
from optrace.frontend.target import parse_pids


def _pid_values(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(parse_pids(values))


def pid_option(*names: str, help: str, dest: str = "pids") -> Callable[[Any], Any]:
    """A repeatable pid option that also takes comma lists; the command gets a tuple of ints."""
    return click.option(*names, dest, multiple=True, metavar="PID[,PID...]", callback=_pid_values, help=help)


# perf report's sort keys that name an optrace key, and its column keys (optrace always orders rows by
# samples, which is what they ask for); perf's other keys are not in optrace's records.
PERF_SORT_ALIASES = {"sym": "symbol", "tgid": "pid"}
PERF_COLUMN_KEYS = frozenset({"overhead", "overhead_children", "sample", "samples", "period"})
PERF_ONLY_SORT_KEYS = frozenset({
    "cpu", "socket", "parent", "srcline", "srcfile", "local_weight", "weight", "transaction", "trace",
    "sym_size", "dso_size", "cgroup", "cgroup_id", "time", "code_page_size", "addr", "ins_lat",
    "local_ins_lat", "p_stage_cyc", "local_p_stage_cyc", "ipc_null", "ipc_lbr", "symoff", "simd",
    "dso_from", "dso_to", "sym_from", "sym_to", "mispredict", "in_tx", "abort", "cycles", "srcline_from",
    "srcline_to", "mem", "dcacheline", "phys_daddr", "data_page_size", "blocked", "retire_lat",
})


CALL_GRAPHS = ("dwarf", "fp")  # how user stacks are walked (SessionOptions.call_graph)


def unwind_option(default: str = "dwarf") -> Callable[[Any], Any]:
    """``--call-graph dwarf|fp`` of the commands that sample (record, top, serve): how user stacks are walked."""
    return click.option("--call-graph", "call_graph", type=click.Choice(CALL_GRAPHS), default=default,
                        show_default=True,
                        help="How user stacks are walked: from the files' CFI in BPF (frame pointers where there is "
                             "none), or frame pointers only.")


def verbose_option() -> Callable[[Any], Any]:
    """``-v`` of the commands that load BPF programs (record, count, top): say whether they were compiled."""
    return click.option("-v", "--verbose", is_flag=True,
                        help="Say which BPF programs were loaded stored and which were compiled (and how long each took).")


def say_program_loads(loads) -> None:
    """The -v line: the BPF programs loaded (bpf/loader.py's ProgramLoad list), on stderr."""
    from optrace.bpf.loader import loads_summary  # only commands that loaded programs get here

    click.echo(f"optrace: {loads_summary(loads)}", err=True)


def perf_sort_keys(text: str, valid: tuple[str, ...]) -> str:
    """perf's `--sort` spelling -> optrace's: `sym` is `symbol`, `overhead`/`sample` are dropped (rows are
    ordered by samples anyway); a perf key optrace does not record is an error that says so."""
    keys = []
    for part in (p.strip() for p in text.split(",")):
        if part in PERF_ONLY_SORT_KEYS:
            raise OptraceError(f"perf's sort key {part!r} is not in optrace's records: valid keys are "
                               f"{', '.join(valid)}")
        if part and part not in PERF_COLUMN_KEYS:
            keys.append(PERF_SORT_ALIASES.get(part, part))
    return ",".join(keys)


def parse_percent(text: str, option: str = "--percent-limit") -> float:
    """`1`, `1.5` or perf's `1%`: a number from 0 to 100."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 100.0:
        raise OptraceError(f"{option} takes a number from 0 to 100 (or perf's 1%), not {text!r}")
    return value


CALL_GRAPH_MODES = ("graph", "flat", "fractal", "folded", "none")
CALL_GRAPH_ORDERS = ("caller", "callee")
PERF_CALL_GRAPH_DEFAULT = "graph,0.5,caller"  # perf report's -g without a value (its documented default)


@dataclass(frozen=True)
class CallGraphSpec:
    """perf report's `-g/--call-graph` value, in any of perf's forms: `caller`, `callee`, `none`,
    `graph,0.5,caller`, `fractal,0.5,callee,function,percent`, `folded`... (tokens in any order, as perf's
    parse_callchain_report_opt reads them: a mode, an order, then a threshold and a print limit)."""

    mode: str = "graph"
    order: str = "caller"
    threshold: float = 0.5  # percent: branches under it are left out
    print_limit: int | None = None


CALL_GRAPH_IGNORED = frozenset({"function", "address", "percent", "period", "count", "branch", "nobranch"})


def parse_call_graph(text: str) -> CallGraphSpec:
    """One parser for every command that takes perf's call-graph forms (report's -g/-G/--call-graph)."""
    fields: dict[str, object] = {}
    numbers = 0
    for token in (t.strip().lower() for t in text.split(",") if t.strip()):
        if token in CALL_GRAPH_MODES:
            fields["mode"] = token
        elif token in CALL_GRAPH_ORDERS:
            fields["order"] = token
        elif token in CALL_GRAPH_IGNORED:
            continue  # perf's key/value/branch choices: optrace graphs functions by samples
        elif numbers == 0 and _is_percent(token):
            fields["threshold"], numbers = parse_percent(token, "--call-graph's threshold"), 1
        elif numbers == 1 and token.isdigit():
            fields["print_limit"], numbers = int(token), 2
        else:
            raise OptraceError(f"--call-graph takes perf's forms ({'|'.join(CALL_GRAPH_MODES)}, "
                               f"{'|'.join(CALL_GRAPH_ORDERS)}, a threshold %), not {text!r}")
    return CallGraphSpec(**fields)  # type: ignore[arg-type]


def _is_percent(token: str) -> bool:
    try:
        float(token.removesuffix("%"))
    except ValueError:
        return False
    return True
