"""The one-way arrow of the design (README "Design"), checked on every import of every product file.

kernel maps (bpf/) -> raw samples -> symbols (frontend/symbols, jitmaps/) -> rows -> outputs (exporters/),
with the core (optrace/) under all of them. Imports inside functions count too: a lazy import is still
a dependency. A check written here with ``ast`` rather than import-linter, because the package's folders
are mapped into ``optrace.*`` by setuptools (pyproject.toml), which import-linter's file-system walk of
the installed package does not see.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support import REPO

FOLDERS = {"optrace": "optrace", "bpf": "optrace.bpf", "frontend": "optrace.frontend",
           "jitmaps": "optrace.jitmaps", "exporters": "optrace.exporters"}
CORE_MODULES = {"optrace", "optrace.errors", "optrace.model", "optrace.schema", "optrace.recordfile",
                "optrace.procfs", "optrace.kernel", "optrace.fileaccess", "optrace.outputdir", "optrace.outputfile",
                "optrace.escape",
                "optrace.heap", "optrace.probes", "optrace.cachedir", "optrace.pythonlayout"}
# folder -> the optrace packages its files may import (besides their own folder and the core)
ALLOWED = {
    "optrace": set(),
    "bpf": set(),
    "jitmaps": set(),
    # the models outputs print: report's rows and count's calls (frontend/report holds only pure models),
    # and the JIT files jit show lists (jitmaps imports only the core)
    "exporters": {"optrace.frontend.report", "optrace.jitmaps"},
    "frontend": {"optrace.bpf", "optrace.jitmaps", "optrace.exporters"},
}
NOT_FROM = {"optrace.frontend.report": {"optrace.exporters"},  # the row model never imports its outputs
            # ELF and DWARF readers (call-frame information included) under the unwinder, never the reverse
            "optrace.frontend.symbols": {"optrace.frontend.unwind"}}


def product_files() -> list[tuple[str, Path]]:
    return [(folder, path) for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "optrace" or name.startswith("optrace.")}


def owner(module: str) -> str:
    """The folder a module of the optrace namespace comes from."""
    for folder, package in FOLDERS.items():
        if folder != "optrace" and (module == package or module.startswith(package + ".")):
            return folder
    return "optrace"


def module_name(folder: str, path: Path) -> str:
    parts = path.relative_to(REPO / folder).with_suffix("").parts
    return ".".join((FOLDERS[folder], *parts))


def violations(folder: str, path: Path) -> list[str]:
    bad = []
    here = module_name(folder, path) if path.is_relative_to(REPO / folder) else FOLDERS[folder]
    forbidden = {p for package, packages in NOT_FROM.items() if here.startswith(package + ".") for p in packages}
    for module in sorted(imported_modules(path)):
        if any(module == p or module.startswith(p + ".") for p in forbidden):
            bad.append(f"{module} (not from {here})")
            continue
        target = owner(module)
        if target == folder:
            continue
        if target == "optrace":
            if module not in CORE_MODULES and module.rsplit(".", 1)[0] not in CORE_MODULES:
                bad.append(f"{module} (not a core module)")
            continue
        if not any(module == p or module.startswith(p + ".") for p in ALLOWED[folder]):
            bad.append(module)
    return bad


@pytest.mark.parametrize("folder,path", product_files(), ids=lambda v: str(v.relative_to(REPO)) if isinstance(v, Path) else v)
def test_imports_point_one_way(folder: str, path: Path) -> None:
    assert violations(folder, path) == [], f"{path.relative_to(REPO)} imports against the arrow"


def test_the_check_sees_a_backwards_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from optrace.frontend.recorder import Recorder\n")
    assert violations("exporters", bad) == ["optrace.frontend.recorder", "optrace.frontend.recorder.Recorder"]
    assert violations("bpf", bad) and not violations("frontend", bad)
    rows = REPO / "frontend" / "report" / "model_that_prints.py"
    assert module_name("frontend", rows) == "optrace.frontend.report.model_that_prints"
