"""`optrace top`'s full-screen view, drawn with rich (alternate screen, redrawn each refresh and on each
key), and the plain-table mode for pipes and ``--stdio``. The loop is the same for both: refresh every
interval, poll the session's exec/exit events in between, stop on q, Ctrl-C or SIGTERM."""
from __future__ import annotations

import os
import sys
import time
from typing import Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from optrace.exporters.formats import TOP
from optrace.frontend.report import topcells
from optrace.frontend.report.toprows import TopSnapshot
from optrace.frontend.stopsignals import StopSignals
from optrace.frontend.top.controls import HELP, Controls
from optrace.frontend.top.engine import TopEngine
from optrace.frontend.top.keys import Keys

POLL_S = 0.1  # keys and exec events are looked at this often
MIN_WIDTH, MIN_HEIGHT = 40, 6
CHROME_LINES = 5
NAME_WIDTH = 24  # a command or object name column  # header, state, table title, help, prompt


class Ui(Protocol):
    # True: refresh every ``first_refresh_s`` until there are rows (a screen shows them as soon as they are
    # there); False: every interval from the start (a log's tables, and ``-n``, are per interval)
    quick_first: bool

    def show(self, engine: TopEngine) -> None: ...
    def wait(self, seconds: float) -> bool: ...  # True: quit


def run(engine: TopEngine, ui: Ui, stop: StopSignals) -> None:
    """Refreshes once per interval; on a screen, every ``first_refresh_s`` until there are rows (they
    appear within a second of the attach)."""
    options = engine.options
    first = min(options.first_refresh_s, options.interval_s) if ui.quick_first else options.interval_s
    ui.show(engine)
    engine.start()  # with the screen already up: its first rows then need only the first refresh
    ui.show(engine)
    next_refresh = time.monotonic() + first
    while not stop.stopped.is_set():
        now = time.monotonic()
        if now >= next_refresh:
            engine.refresh()
            ui.show(engine)
            interval = options.interval_s if engine.totals.self_totals else first
            next_refresh = max(next_refresh + interval, now + interval / 2)
            if options.iterations is not None and engine.refreshes >= options.iterations:
                return
            continue
        engine.poll()
        if ui.wait(min(POLL_S, next_refresh - now)):
            return


class PlainUi:
    """A plain table per refresh (top's stdio format), for logs."""

    quick_first = False

    def __init__(self, stream: TextIO, stop: StopSignals, rows: int) -> None:
        self.stream, self.stop, self.rows = stream, stop, rows
        self._write = TOP.writer("stdio")

    def show(self, engine: TopEngine) -> None:
        if engine.refreshes:
            self._write(self.stream, engine.snapshot(self.rows), None)

    def wait(self, seconds: float) -> bool:
        return self.stop.wait(seconds)


class ScreenUi:
    quick_first = True

    def __init__(self, live: Live, console: Console, keys: Keys, controls: Controls) -> None:
        self.live, self.console, self.keys, self.controls = live, console, keys, controls
        self._engine: TopEngine | None = None

    def show(self, engine: TopEngine) -> None:
        self._engine = engine
        width, height = self.console.size = terminal_size(self.console)
        if width < MIN_WIDTH or height < MIN_HEIGHT:
            body = Text(f"terminal too small ({width}x{height}): enlarge it to {MIN_WIDTH}x{MIN_HEIGHT}, or q")
        else:
            body = render(engine.snapshot(max(height - CHROME_LINES, 1)), self.controls.prompt, engine.refreshes)
        self.live.update(body, refresh=True)

    def wait(self, seconds: float) -> bool:
        keys = self.keys.read(seconds)
        if not keys:
            return False
        if self.controls.feed(keys):
            return True
        if self._engine is not None:
            self.show(self._engine)
        return False


def terminal_size(console: Console) -> tuple[int, int]:
    """The terminal's size now, from the terminal itself: COLUMNS and LINES in the environment (which
    rich prefers) may be stale, and the terminal may have been resized since the last refresh."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return console.size
    return size.columns, size.lines


def render(snapshot: TopSnapshot, prompt: str, refreshes: int) -> Group:
    view = snapshot.view
    titles = topcells.titles(view)
    numeric = len(titles) - len(view.sort)
    table = Table(box=None, pad_edge=False, expand=True, show_edge=False, header_style="bold")
    for i, title in enumerate(titles):
        if i < numeric:
            table.add_column(title, justify="right", no_wrap=True, min_width=max(len(title), 7))
        else:  # names: the last one takes what is left, the others at most NAME_WIDTH
            last = i == len(titles) - 1
            table.add_column(title, no_wrap=True, overflow="ellipsis", ratio=1 if last else None,
                             max_width=None if last else NAME_WIDTH, min_width=min(len(title), 8))
    for row in snapshot.rows:
        style = "bold red" if row.percent >= 5.0 else "green" if row.percent >= 0.5 else ""
        table.add_row(*(Text(cell) for cell in topcells.cells(row, view)), style=style)
    waiting = Text("(no samples match)" if refreshes else "collecting samples..." if snapshot.header.event
                   else "loading the BPF program...", style="dim")
    parts = [Text(f"optrace top {snapshot.time}  " + topcells.header_line(snapshot.header, view), style="bold"),
             Text(topcells.state_line(view)), table if snapshot.rows else waiting,
             Text(prompt or HELP, style="reverse" if prompt else "dim")]
    return Group(*parts)


def run_screen(engine: TopEngine, stop: StopSignals) -> None:
    """Full screen on the terminal; the terminal's modes and screen are restored however this ends."""
    console = Console(highlight=False)
    controls = Controls(engine.options.view)
    with Keys(sys.stdin.fileno()) as keys, Live(console=console, screen=True, auto_refresh=False,
                                                 redirect_stdout=False, redirect_stderr=False) as live:
        run(engine, ScreenUi(live, console, keys, controls), stop)
