"""How a frame is named where one name stands for it (folded stacks, flame graphs, call graphs, top).

A Python frame reads as Python users read it, as py-spy prints it: ``Handler.get (app/views.py:42)``, the
qualified name, the file as it is imported (the part after site-packages or the standard library's folder),
and the line the frame was running. Other frames are their symbol.
"""
from __future__ import annotations

import re

from optrace.model import Frame

# The folders Python imports from: what follows them is the module's path as an import names it.
_IMPORT_ROOTS = re.compile(r".*/(?:site-packages|dist-packages|lib/python\d+\.\d+)/")


def short_filename(path: str) -> str:
    """``/usr/lib/python3/dist-packages/requests/api.py`` -> ``requests/api.py``; other paths as they are."""
    return _IMPORT_ROOTS.sub("", path, count=1)


def frame_label(frame: Frame) -> str:
    if not frame.runtime:
        return frame.symbol
    where = short_filename(frame.dso)
    return f"{frame.symbol} ({where}:{frame.line})" if frame.line else f"{frame.symbol} ({where})"
