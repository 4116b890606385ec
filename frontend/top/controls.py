"""What `top`'s keys do to the view: q quit, s next sort, k kernel rows, / filter (Enter keeps it, Esc
drops it), p pause, c children."""
from __future__ import annotations

from optrace.frontend.report.toprows import SORT_PRESETS, ViewState

HELP = "q quit  s sort  k kernel  / filter  p pause  c children"
MAX_FILTER = 80
ESC, BACKSPACE, DELETE = "\x1b", "\x08", "\x7f"


class Controls:
    def __init__(self, view: ViewState) -> None:
        self.view = view
        self.sorts = list(dict.fromkeys([view.sort, *SORT_PRESETS]))
        self.editing: str | None = None  # the filter being typed after "/"

    def feed(self, keys: str) -> bool:
        """Apply the keys typed; True when one of them asks to quit."""
        for key in keys:
            if self.editing is not None:
                self._edit(key)
            elif key == "q":
                return True
            else:
                self._command(key)
        return False

    def _command(self, key: str) -> None:
        view = self.view
        if key == "s":
            view.sort = self.sorts[(self.sorts.index(view.sort) + 1) % len(self.sorts)]
        elif key == "k":
            view.show_kernel = not view.show_kernel
        elif key == "c":
            view.children = not view.children
        elif key == "p":
            view.paused = not view.paused
        elif key == "/":
            self.editing = ""

    def _edit(self, key: str) -> None:
        if key in "\r\n":
            self.view.filter, self.editing = self.editing, None
        elif key == ESC:
            self.editing = None
        elif key in (BACKSPACE, DELETE):
            self.editing = self.editing[:-1]
        elif key.isprintable() and len(self.editing) < MAX_FILTER:
            self.editing += key

    @property
    def prompt(self) -> str:
        return "" if self.editing is None else f"filter (Enter to apply, Esc to cancel): {self.editing}"
