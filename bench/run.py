"""`make bench`: run every bench/bench_*.py in its own process with a time budget, then write bench/README.md.

Each benchmark is a standalone script that prints a markdown section on stdout (progress goes to
stderr), writes bench/results/<area>.json and may declare `BENCH_BUDGET_S = N` (seconds; default
DEFAULT_BUDGET_S). A benchmark that fails or runs out of time is reported in the README with the tail of
its stderr; the others still run. Usage:
    .venv/bin/python bench/run.py [--only AREA ...] [--list]
With --only, the README keeps the other benchmarks' sections from their last run (marked with its date):
each run's outcome (its markdown section, status and targets) is kept in bench/outcomes/<area>.json, which
is tracked, so a fresh clone (where bench/results/ is empty) rewrites only what it ran. `--render` rebuilds
the README from the stored outcomes without running anything (e.g. after merging two branches' outcomes).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, ROOT, machine_info, md_table  # noqa: E402

BENCH_DIR = ROOT / "bench"
README = BENCH_DIR / "README.md"
OUTCOMES = BENCH_DIR / "outcomes"  # tracked: one small JSON per benchmark, its last outcome
MACHINE = OUTCOMES / "machine.json"  # the machine of the last real run
DEFAULT_BUDGET_S = 180
GRACE_S = 20  # after the budget: SIGINT to the bench's process group, then SIGKILL after this long
BUDGET_LINE = re.compile(r"^BENCH_BUDGET_S\s*=\s*(\d+)", re.MULTILINE)
STDERR_TAIL_LINES = 25


@dataclass
class Outcome:
    """What one benchmark run produced; saved as outcomes/<area>.json for later README builds."""

    area: str
    status: str  # "ok", "failed (exit N)", "timed out after N s", "no results file"
    seconds: float
    budget_s: int
    finished: str  # UTC time stamp
    markdown: str
    stderr_tail: str
    targets: list[dict]
    load_at_start: str = ""  # the machine's load averages when it started (other work shows here)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def discover() -> dict[str, Path]:
    return {path.stem.removeprefix("bench_"): path for path in sorted(BENCH_DIR.glob("bench_*.py"))}


def budget_of(script: Path) -> int:
    match = BUDGET_LINE.search(script.read_text())
    return int(match.group(1)) if match else DEFAULT_BUDGET_S


def _tee(stream, sink: list[str]) -> None:
    """Show a bench's progress live and keep it for the README if the bench fails."""
    for line in iter(stream.readline, ""):
        sys.stderr.write(line)
        sys.stderr.flush()
        sink.append(line)


def _stop_group(proc: subprocess.Popen) -> None:
    """Ctrl-C to the whole group first (profilers write their files and detach on it), then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_bench(area: str, script: Path) -> Outcome:
    budget = budget_of(script)
    results_file = RESULTS / f"{area}.json"
    started = time.time()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== bench {area}: {script.relative_to(ROOT)} (budget {budget} s)", file=sys.stderr, flush=True)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    stdout: list[str] = []
    stderr: list[str] = []
    readers = [threading.Thread(target=lambda: stdout.extend(proc.stdout), daemon=True),
               threading.Thread(target=_tee, args=(proc.stderr, stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=budget)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        status = f"timed out after {budget} s"
    for reader in readers:
        reader.join(timeout=10)
    results = None
    if results_file.exists() and results_file.stat().st_mtime >= started:
        results = json.loads(results_file.read_text())
    elif status == "ok":
        status = "no results file"
    outcome = Outcome(
        area=area,
        status=status,
        seconds=time.time() - started,
        budget_s=budget,
        finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        markdown="".join(stdout).strip() if status == "ok" else "",
        stderr_tail="".join(stderr[-STDERR_TAIL_LINES:]),
        targets=(results or {}).get("targets", []),
        load_at_start=load,
    )
    OUTCOMES.mkdir(exist_ok=True)
    (OUTCOMES / f"{area}.json").write_text(json.dumps(asdict(outcome), indent=2) + "\n")
    print(f"== bench {area}: {status} in {outcome.seconds:.0f} s", file=sys.stderr, flush=True)
    return outcome


def load_previous(area: str) -> Outcome | None:
    path = OUTCOMES / f"{area}.json"
    try:
        return Outcome(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def previous_readme() -> str:
    try:
        return README.read_text()
    except OSError:
        return ""


def stored_machine() -> dict[str, str]:
    """The machine the stored outcomes were measured on (the last real run's), not the one rendering."""
    try:
        return json.loads(MACHINE.read_text())
    except (OSError, ValueError):
        return {"machine": "not recorded"}


def readme(outcomes: dict[str, Outcome | None], fresh: set[str], machine: dict[str, str], total_s: float,
           previous: str = "") -> str:
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    parts = [
        "# optrace benchmarks",
        "",
        (f"Written by `make bench` (bench/run.py) on {now}; this run took {total_s / 60:.1f} min. " if fresh else
         f"Rebuilt from bench/outcomes/ on {now} (`bench/run.py --render`). ")
        + "Each benchmark's numbers come from one run of it on the machine described here, optrace side by side "
        "with the reference tools in the same run (the Benchmarks table says when). Targets come from the "
        "issues; a target not met is shown as NOT met.",
        "",
        "## Machine",
        "",
        md_table(["", ""], list(machine.items())),
        "",
        "## Benchmarks",
        "",
    ]
    rows = []
    for area, outcome in outcomes.items():
        if outcome is None:
            rows.append([area, "not run yet", "", "", ""])
            continue
        when = "this run" if area in fresh else f"earlier run, {outcome.finished}"
        rows.append([area, outcome.status, f"{outcome.seconds:.0f}", outcome.budget_s, when,
                     outcome.load_at_start or "not recorded"])
    parts += [md_table(["bench", "status", "seconds", "budget s", "from", "load at start"], rows), ""]
    target_rows = [[area, t.get("name", ""), t.get("target", ""), t.get("measured", ""),
                    {True: "met", False: "NOT met"}.get(t.get("met"), "n/a")]
                   for area, outcome in outcomes.items() if outcome for t in outcome.targets]
    if target_rows:
        parts += ["## Targets", "", md_table(["bench", "what", "target", "measured", "verdict"], target_rows), ""]
    for area, outcome in outcomes.items():
        if outcome is None:
            continue
        if outcome.ok:
            parts += [outcome.markdown, ""]
        else:
            parts += [f"## {area}: {outcome.status}", "", "Last lines of its stderr:", "", "```",
                      outcome.stderr_tail.rstrip(), "```", ""]
    parts += kept_sections(previous, "\n".join(parts) + HARNESS)
    parts += [HARNESS]
    return "\n".join(parts)


def sections(text: str) -> dict[str, str]:
    """The README's second-level sections by heading line (the text before the first one is left out)."""
    found: dict[str, str] = {}
    chunks = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    for chunk in chunks[1:]:
        found[chunk.split("\n", 1)[0].strip()] = chunk.rstrip() + "\n"
    return found


def kept_sections(previous: str, generated: str) -> list[str]:
    """Sections written by hand into the README (no outcome makes them): kept as they are, so rendering
    never loses a section a benchmark's author added before storing its outcome."""
    made = set(sections(generated))
    return [text for heading, text in sections(previous).items() if heading not in made]


HARNESS = """## How these numbers are made
`make bench` runs `make setup`, then `bench/run.py`, which runs each `bench/bench_<area>.py` in its own
process group with the budget the script declares (`BENCH_BUDGET_S`); past it the group gets Ctrl-C
(tools write their files and detach) and then SIGKILL. Each script prints its markdown section (above) and
writes `bench/results/<area>.json`, whose `targets` list (`name`, `target`, `measured`, `met`) feeds the
Targets table. One failing benchmark is reported here and does not stop the others.
`.venv/bin/python bench/run.py --only AREA` reruns one benchmark and keeps the others' last sections
(from `bench/outcomes/`, tracked); `--render` rebuilds this file from those outcomes alone.
The machine is a shared 2-CPU VM: expect a few percent of run-to-run noise in timings.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the optrace benchmarks and write bench/README.md.")
    parser.add_argument("--only", nargs="+", metavar="AREA", help="run only these benchmarks")
    parser.add_argument("--list", action="store_true", help="list benchmarks and their budgets")
    parser.add_argument("--render", action="store_true", help="rewrite README.md from bench/outcomes/, run nothing")
    args = parser.parse_args()
    benches = discover()
    if args.list:
        for area, script in benches.items():
            print(f"{area}\t{budget_of(script)} s\t{script.relative_to(ROOT)}")
        return 0
    unknown = set(args.only or ()) - set(benches)
    if unknown:
        print(f"run.py: no such benchmark: {', '.join(sorted(unknown))} (have: {', '.join(benches)})",
              file=sys.stderr)
        return 2
    if args.render:
        outcomes = {area: load_previous(area) for area in benches}
        README.write_text(readme(outcomes, set(), stored_machine(), 0.0, previous_readme()))
        return 0
    if os.geteuid() != 0:
        print("run.py: the benchmarks attach BPF programs and perf events: run as root (sudo make bench)",
              file=sys.stderr)
        return 2
    selected = args.only or list(benches)
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    OUTCOMES.mkdir(exist_ok=True)
    MACHINE.write_text(json.dumps(machine, indent=2) + "\n")
    total_budget = sum(budget_of(benches[a]) for a in selected)
    print(f"== {len(selected)} benchmarks, budgets add up to {total_budget / 60:.1f} min", file=sys.stderr)
    started = time.time()
    outcomes: dict[str, Outcome | None] = {area: load_previous(area) for area in benches}
    for area in selected:
        outcomes[area] = run_bench(area, benches[area])
    README.write_text(readme(outcomes, set(selected), machine, time.time() - started, previous_readme()))
    print(f"== wrote {README.relative_to(ROOT)}", file=sys.stderr)
    failed = [area for area in selected if not outcomes[area].ok]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
