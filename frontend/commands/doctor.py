"""`optrace doctor`: print every check with ok/FAIL and its fix; exit 1 when something required fails."""
from __future__ import annotations

import click

from optrace.errors import OptraceError
from optrace.frontend.preflight import CheckResult, run_checks, summary
from optrace.frontend.runtimes.registry import doctor_checks


def format_result(result: CheckResult) -> str:
    line = f"{result.status:<4}  {result.name:<20}  {result.detail}"
    return f"{line}: fix: {result.fix}" if result.fix and not result.ok else line


@click.command("doctor")
def command() -> None:
    """Check that this machine can record, and say how to fix what is missing."""
    results = [*run_checks(), *doctor_checks()]
    for result in results:
        click.echo(format_result(result))
    failed = [result for result in results if not result.ok and result.required]
    if failed:
        raise OptraceError(f"{len(failed)} check(s) failed, recording cannot work here; first: {summary(failed[0])}")
    click.echo("all required checks passed: optrace record can run here")
