"""Options several commands share, spelled the way perf users type them.

One place for each: the sampling options of record, top and serve (`-F` and `--call-graph`, with their
defaults from optrace/defaults.py, and the frequency's check), the pid list (`-p 1,2` or `-p 1 -p 2` in
record, count, serve and report), the rows' keys and filters of report and diff, and perf's report
spellings (`--sort sym`, `--percent-limit 1%`, `-g`/`--call-graph` forms), so that every command that
takes them parses them alike.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from optrace.defaults import CALL_GRAPHS, DEFAULT_CALL_GRAPH, DEFAULT_FREQUENCY_HZ
from optrace.errors import OptraceError
from optrace.frontend.report.pythonview import PYTHON_INTERNALS
from optrace.frontend.report.rows import SORT_KEYS, ReportOptions, parse_sort_keys
from optrace.frontend.target import parse_pids
from optrace.kernel import max_sample_rate


def _pid_values(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(parse_pids(values))


def subprocesses_option() -> Callable[[Any], Any]:
    """py-spy's --subprocesses: with -p, the processes' descendants too (those forked later are followed anyway)."""
    return click.option("--subprocesses", is_flag=True,
                        help="With -p: the processes' descendants running now too, e.g. a pre-fork server's "
                             "workers (those started later are always followed).")


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


PERF_MAX_STACK_DUMP = 65528  # perf record's largest dwarf,SIZE: 64 KiB less 8, in whole u64s


def frequency_option() -> Callable[[Any], Any]:
    """``-F/--freq HZ`` of the commands that sample (record, top, serve); check it with :func:`check_frequency`."""
    return click.option("-F", "--freq", "frequency", type=int, default=DEFAULT_FREQUENCY_HZ, show_default=True,
                        help="Samples per second per CPU.")


def check_frequency(hz: int) -> None:
    """perf's rule: a frequency above kernel.perf_event_max_sample_rate is refused, not clamped (the
    kernel lowers that cap by itself when sampling interrupts take too long)."""
    if hz < 1:
        raise OptraceError(f"frequency {hz} Hz is out of range: use 1 or more")
    limit = max_sample_rate()
    if hz > limit:
        raise OptraceError(f"frequency {hz} Hz is above kernel.perf_event_max_sample_rate ({limit}): use -F {limit} "
                           f"or less, or raise the cap with sysctl -w kernel.perf_event_max_sample_rate={hz}")


def unwind_option(default: str = DEFAULT_CALL_GRAPH) -> Callable[[Any], Any]:
    """``--call-graph dwarf|fp`` of the commands that sample (record, top, serve): how user stacks are walked.
    perf's ``dwarf,SIZE`` is taken too (see :func:`parse_unwind`)."""
    return click.option("--call-graph", "call_graph", callback=_unwind_value, default=default, show_default=True,
                        metavar="dwarf|fp",
                        help="How user stacks are walked: from the files' CFI in BPF (frame pointers where there is "
                             "none), or frame pointers only. perf's dwarf,SIZE is accepted: SIZE is the bytes of "
                             "stack perf copies per sample to unwind later; optrace copies none (it unwinds in "
                             "BPF as it samples), so SIZE is checked as perf checks it and changes nothing.")


def _unwind_value(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return parse_unwind(value)
    except ValueError as err:
        raise click.BadParameter(str(err), ctx, param) from None


def parse_unwind(text: str) -> str:
    """``dwarf``, ``fp`` or perf's ``dwarf,SIZE`` -> the walk, "dwarf" or "fp". SIZE, perf's bytes of user
    stack copied per sample, is refused where perf refuses it (0, over PERF_MAX_STACK_DUMP once rounded up
    to 8 bytes, not a number, after fp) and otherwise has no use: the BPF walker reads the stack frame by
    frame as it samples and keeps no copy. Raises ValueError."""
    mode, comma, size = text.strip().lower().partition(",")
    if mode not in CALL_GRAPHS:
        raise ValueError(f"{text!r} is not one of dwarf, dwarf,SIZE or fp")
    if comma and mode != "dwarf":
        raise ValueError(f"{mode} takes no size, as in perf: {text!r}")
    if comma and not (size.isdigit() and 0 < -(-int(size) // 8) * 8 <= PERF_MAX_STACK_DUMP):
        raise ValueError(f"dwarf's stack size is 1 to {PERF_MAX_STACK_DUMP} bytes, as perf takes it, not {size!r}")
    return mode


def python_option() -> Callable[[Any], Any]:
    """``--python on|off`` of the commands that sample: Python frames in place of the interpreter's."""
    return click.option("--python", "python", type=click.Choice(("on", "off")), default="on", show_default=True,
                        callback=lambda ctx, param, value: value == "on",
                        help="Show the Python functions CPython processes run (3.8+, found without any flag in the "
                             "process) in place of the interpreter's eval frames; needs --call-graph dwarf.")


def python_internals_option() -> Callable[[Any], Any]:
    """``--python-internals`` of the commands that show profiles (report, diff, top, serve): the interpreter's own
    frames below Python functions as they are, not folded into them (frontend/report/pythonview.py)."""
    return click.option(PYTHON_INTERNALS, "python_internals", is_flag=True,
                        help="Show the CPython interpreter's own frames (python3.X, libpython: PyObject_Free, "
                             "PyLong_FromLong...) below a Python function. By default they count as that function's "
                             "own time, as py-spy shows it; native code it called (C extensions, libraries, the "
                             "kernel) stays either way.")


def verbose_option() -> Callable[[Any], Any]:
    """``-v`` of the commands that load BPF programs (record, count, top): say whether they were compiled."""
    return click.option("-v", "--verbose", is_flag=True,
                        help="Say which BPF programs were loaded stored and which were compiled (and how long each took).")


def program_loads_line(loads=None) -> str:
    """What -v says of the BPF programs loaded (bpf/loader.py's ProgramLoad list; default: all of this
    process's): which were loaded stored, which compiled."""
    from optrace.bpf.loader import loads_summary, program_loads  # only commands that loaded programs get here

    return loads_summary(program_loads() if loads is None else loads)


def say_program_loads(loads=None) -> None:
    """The -v line, on stderr."""
    click.echo(f"optrace: {program_loads_line(loads)}", err=True)


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


ROW_OPTIONS = (  # the rows' keys and filters, the same in report and diff
    click.option("-s", "--sort", "sort", default="comm,dso,symbol", show_default=True,
                 help="Comma-separated row keys: comm, pid, tid, dso, symbol (perf's sym, overhead... too)."),
    pid_option("--pid", help="Only these processes (repeat, or comma list)."),
    click.option("--comm", "comms", default="", help="Only these command names (comma-separated)."),
    click.option("--dso", "dsos", default="", help="Only these objects, by basename or full path (comma-separated)."),
)


def row_options(function: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(ROW_OPTIONS):
        function = option(function)
    return function


def report_options(sort: str, pids: tuple[int, ...], comms: str, dsos: str, percent_limit: str, children: bool,
                   call_graph: str | None, tids: tuple[int, ...] = ()) -> ReportOptions:
    """The options as report's model takes them (report's and diff's)."""
    return ReportOptions(
        sort=parse_sort_keys(perf_sort_keys(sort, SORT_KEYS)),
        pids=frozenset(pids),
        tids=frozenset(tids),
        comms=comma_list(comms),
        dsos=comma_list(dsos),
        percent_limit=parse_percent(percent_limit),
        children=children,
        call_graph=_graph_order(call_graph),
    )


def _graph_order(text: str | None) -> str:
    """-G's order, or "" for no call graph (no -G, or perf's `none`)."""
    if text is None:
        return ""
    spec = parse_call_graph(text)
    return "" if spec.mode == "none" else spec.order


def comma_list(text: str) -> frozenset[str]:
    """`a, b,,c` -> {a, b, c}: the comma lists of --comm, --dso."""
    return frozenset(part.strip() for part in text.split(",") if part.strip())
