"""`optrace doctor`: print every check with ok/FAIL and its fix; exit 1 when something required fails."""
from __future__ import annotations

import click

from optrace.frontend.doctor import format_result, run_checks, summary
from optrace.errors import OptraceError


@click.command("doctor")
def command() -> None:
    """Check that this machine can record, and say how to fix what is missing."""
    results = run_checks()
    for result in results:
        click.echo(format_result(result))
    failed = [result for result in results if not result.ok and result.required]
    if failed:
        raise OptraceError(f"{len(failed)} check(s) failed, recording cannot work here; first: {summary(failed[0])}")
    click.echo("all required checks passed: optrace record can run here")
