"""`optrace record`: profile a command, processes, or the whole machine into a record file."""
from __future__ import annotations

import os

import click

from optrace.errors import OptraceError
from optrace.frontend.recorder import Recorder, RecordOptions
from optrace.frontend.cliopts import (check_frequency, frequency_option, pid_option, python_option, say_program_loads,
                                      subprocesses_option, unwind_option, verbose_option)
from optrace.frontend.session import DEFAULT_JIT_MAX_FILE_SIZE, OffCpuOptions, check_off_cpu_every
from optrace.frontend.target import check_command, check_pids, describe_exit, shell_status
from optrace.escape import escape_controls

MAX_MIN_BLOCK_US = 3_600_000_000  # an hour
# perf's -e names of the event optrace samples: the timer-driven cpu-clock (the sampler takes cycles instead
# where the CPU has a PMU, as BCC's profile does)
SAMPLED_EVENTS = ("cpu-clock",)


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("-o", "--output", default="optrace.data", show_default=True, help="Record file to write.")
@frequency_option()
@click.option("-e", "--event", "event", default=None, metavar="cpu-clock",
              help="perf's -e: the event sampled, cpu-clock (the one optrace samples: accepted for perf's command "
                   "lines; where the CPU has a PMU, cycles is sampled instead). Waits: --off-cpu.")
@click.option("-g/--no-stacks", "stacks", default=True, help="Keep whole stacks (default) or only the sampled frame.")
@unwind_option()
@python_option()
@pid_option("-p", "--pid", help="Profile running processes (repeat, or comma list).")
@subprocesses_option()
@click.option("-a", "--all-cpus", "system_wide", is_flag=True, help="Profile the whole machine.")
@click.option("-d", "--duration", type=float, help="Stop after this many seconds.")
@click.option("--uprobe", "uprobes", multiple=True, metavar="SPEC", help="Also count calls of SPEC (see optrace count).")
@click.option("--jitdump", "jitdumps", multiple=True, type=click.Path(), help="A jitdump file to use for JIT symbols.")
@click.option("--jit-max-file-size", type=click.IntRange(1), default=DEFAULT_JIT_MAX_FILE_SIZE >> 20, show_default=True,
              metavar="MB", help="Larger perf maps and jitdumps are refused.")
@click.option("--stack-storage-size", type=click.IntRange(1, 1 << 20), default=None,
              help="Distinct stacks the kernel's stack store keeps (more: fewer lost stacks, more memory). "
                   "Default: 4 x CPUs x Hz, 8192 to 131072.")
@click.option("--off-cpu", "off_cpu", is_flag=True, help="Also record where threads wait off CPU (nanoseconds).")
@click.option("--wall", is_flag=True, help="--off-cpu with the CPU samples: where wall-clock time goes.")
@click.option("--min-block", "min_block", type=int, default=1, show_default=True, metavar="US",
              help="With --off-cpu: leave out waits shorter than this many microseconds.")
@click.option("--state", "states", multiple=True, type=click.Choice(["running", "sleeping", "disk"]),
              help="With --off-cpu: only waits that began in this state (repeat; default: all).")
@click.option("--off-cpu-user-stacks", "user_stacks_only", is_flag=True,
              help="With --off-cpu: user stacks only, like perf's --off-cpu (the kernel stack is most of the cost).")
@click.option("--off-cpu-every", "every", type=int, default=1, show_default=True, metavar="N",
              help="With --off-cpu: record one wait in N (at random) and count it N times; N times fewer stacks taken.")
@click.option("--wakers", is_flag=True,
              help="With --off-cpu: join each wait that slept to the stacks of the thread that woke it (report --wakers).")
@verbose_option()
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def command(ctx: click.Context, output, frequency, event, stacks, call_graph, python, pids, subprocesses, system_wide, duration, uprobes, jitdumps, jit_max_file_size,
            stack_storage_size, off_cpu, wall, min_block, states, user_stacks_only, every, wakers, verbose,
            command) -> None:
    """Record a CPU profile: optrace record [OPTIONS] -- CMD ARGS...

    With a command, exits with the command's status (128+N when signal N ended it), like perf; when the
    recording ends first (-d) and stops the command, exits 0."""
    check_event(event)
    wanted = OffCpuOptions(min_block, frozenset(states), kernel_stacks=not user_stacks_only, every=every, wakers=wakers)
    off_cpu_options = off_cpu_settings(off_cpu or wall, wanted, stacks)
    options = RecordOptions(
        frequency_hz=frequency,
        stacks=stacks,
        call_graph=call_graph,
        python=python,
        pids=list(pids),
        subprocesses=subprocesses,
        system_wide=system_wide,
        duration_s=duration,
        command=list(command) or None,
        uprobes=list(uprobes),
        jitdumps=list(jitdumps),
        stack_storage_size=stack_storage_size,
        jit_max_file_size=jit_max_file_size << 20,
        off_cpu=off_cpu_options,
        wall=wall,
    )
    validate(options)
    from optrace.frontend.preflight import require_recording
    from optrace.recordfile import check_record_output, write_record

    require_recording(uprobes=bool(options.uprobes))
    check_record_output(output)
    recorder = Recorder(options)
    record = recorder.run()
    write_record(record, output)
    if verbose:
        say_program_loads(recorder.program_loads)
    summarize(record, output)
    if event and record.meta.event not in ("", event):
        click.echo(f"optrace: note: -e {event}: this CPU has a PMU, and {record.meta.event} was sampled", err=True)
    status = record.meta.exit_status
    if status and not recorder.stopped_command:
        ctx.exit(shell_status(status))


def check_event(event: str | None) -> None:
    """``-e``: perf's name of the event optrace samples, or nothing; any other is refused, not ignored."""
    if event is not None and event not in SAMPLED_EVENTS:
        raise OptraceError(f"-e {escape_controls(event)!r}: record samples {' or '.join(SAMPLED_EVENTS)} only "
                           "(drop -e; --off-cpu records where threads wait)")


def off_cpu_settings(enabled: bool, wanted: OffCpuOptions, stacks: bool) -> OffCpuOptions | None:
    """--off-cpu's settings, refused when they make no sense: an off-CPU leaf frame is the scheduler,
    so without stacks every wait would be one row (`--off-cpu --no-stacks` is an error)."""
    if not enabled:
        if wanted != OffCpuOptions():
            raise OptraceError("--min-block, --state, --off-cpu-user-stacks, --off-cpu-every and --wakers need --off-cpu"
                               " or --wall")
        return None
    if not stacks:
        raise OptraceError("--off-cpu needs stacks (its leaf is always the scheduler): drop --no-stacks")
    if not 0 <= wanted.min_block_us <= MAX_MIN_BLOCK_US:
        raise OptraceError(f"--min-block takes 0..{MAX_MIN_BLOCK_US} microseconds, not {wanted.min_block_us}")
    check_off_cpu_every(wanted.every)
    return wanted


def validate(options: RecordOptions) -> None:
    if not (options.command or options.pids or options.system_wide):
        raise OptraceError("nothing to record: give a command after --, -p PID or -a")
    if options.duration_s is not None and options.duration_s <= 0:
        raise OptraceError("duration must be a positive number of seconds")
    check_frequency(options.frequency_hz)
    check_pids(options.pids)
    if options.subprocesses and not options.pids:
        raise OptraceError("--subprocesses goes with -p PID (a command's children are always followed)")
    if options.command:
        check_command(options.command)


def summarize(record, output: str) -> None:
    meta = record.meta
    for warning in meta.warnings:
        click.echo(f"optrace: warning: {escape_controls(warning)}", err=True)
    if meta.command:
        click.echo(f"[ optrace record: {escape_controls(meta.command[0])}: {describe_exit(meta.exit_status)} ]",
                   err=True)
    lost = sum(n for reason, n in meta.lost.items() if "stack" not in reason)
    stackless = sum(n for reason, n in meta.lost.items() if "stack" in reason)
    lost_text = (f", {lost} lost" if lost else "") + (f", {stackless} without stack" if stackless else "")
    size_kb = os.path.getsize(output) / 1024
    if meta.off_cpu is not None:
        lost_text += f", {meta.off_cpu.total_ns / 1e9:.3f} s off CPU in {len(record.off_cpu)} stacks"
    click.echo(
        f"[ optrace record: {meta.total_samples} samples{lost_text}, {len(record.frames)} frames, "
        f"wrote {escape_controls(output)} ({size_kb:.1f} KB) ]",
        err=True,
    )
