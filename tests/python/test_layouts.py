"""The hand-kept layouts (frontend/runtimes/cpython/layouts.py) against offsetof()s measured again from each
interpreter's own headers by scripts/python_layouts.py, and 3.13's self-description against its headers."""
from __future__ import annotations

import importlib.util
import shutil
from dataclasses import asdict

import pytest

from optrace.frontend.runtimes.cpython.layouts import MEASURED, table_layout, table_thread_offsets, unsupported
from optrace.frontend.runtimes.cpython.layouts import measured as measured_row
from optrace.pythonlayout import CODE_WINDOW, FRAME_WINDOW, MAX_OFFSET
from pythons import include_dir
from support import REPO


def generator():
    spec = importlib.util.spec_from_file_location("python_layouts", REPO / "scripts" / "python_layouts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measured(name: str) -> dict[str, int]:
    folder = include_dir(name)
    if folder is None or shutil.which("cc") is None:
        pytest.skip(f"no headers of python {name} (or no C compiler)")
    return generator().measure(folder)


@pytest.mark.parametrize("name", ["3.8", "3.9", "3.10", "3.11", "3.11-debian", "3.12"])
def test_table_is_what_the_headers_say(name):
    minor = tuple(int(part) for part in name.split("-")[0].split("."))
    assert measured_row(minor) == measured(name)


def test_debian_311_has_pyenv_311_layout():
    """Debian's 3.11.2 and pyenv's 3.11.7 agree field for field (one table entry serves both)."""
    assert measured("3.11-debian") == measured("3.11")


@pytest.mark.parametrize("minor", sorted(MEASURED))
def test_layouts_fit_the_walker(minor):
    layout = asdict(table_layout(minor))
    for name in ("interpreters_head", "interp_threads_head", "tstate_next", "tstate_thread_id", "tstate_frame",
                 "code_adaptive", "unicode_length", "unicode_state", "bytes_size", "bytes_data"):
        assert 0 <= layout[name] < MAX_OFFSET, name
    for name in ("frame_previous", "frame_code", "frame_instr", "frame_entry"):
        assert layout[name] + 8 <= FRAME_WINDOW or name == "frame_entry" and layout[name] < FRAME_WINDOW, name
    for name in ("code_name", "code_qualname", "code_filename", "code_linetable"):
        assert layout[name] + 8 <= CODE_WINDOW, name
    assert table_thread_offsets(minor).tstate_interp < MAX_OFFSET


def test_old_versions_are_refused_and_new_ones_are_not_in_the_table():
    assert unsupported((3, 7)) == "python 3.7 not supported"
    assert unsupported((2, 7)) == "python 2.7 not supported"
    assert unsupported((3, 8)) is None
    assert table_layout((3, 13)) is None and table_layout((3, 7)) is None
