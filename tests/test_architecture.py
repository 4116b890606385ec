"""The one-way arrows of the design (docs/design.md), checked on every import of every product file.

Between folders: kernel maps (bpf/) -> raw samples -> symbols (frontend/symbols, jitmaps/) -> rows
(frontend/report) -> outputs (exporters/), with the core (optrace/) under all of them. Inside frontend/,
its packages and modules stand in layers (FRONTEND_LAYERS): each imports only from the layers below it,
so no two of them import each other, and the commands sit on top, one module each.

What counts as an import: an ``import``/``from`` statement anywhere in the file (a lazy import inside a
function is still a dependency), a string literal that is exactly the name of a product module (what
``importlib.import_module`` and the formats registry load: ``"optrace.exporters.table"``), and the
constant start of an f-string naming one (``f"optrace.frontend.commands.{name}"`` imports the package).
A check written here with ``ast`` rather than import-linter, because the package's folders are mapped
into ``optrace.*`` by setuptools (pyproject.toml), which import-linter's file-system walk of the
installed package does not see.

Beyond imports, rules that keep single ideas single: one containment helper, one base for the errors of
malformed input, one reader of /proc/PID/maps, one place that takes another user's credentials,
exporters/ holding only the registry's writers, and a session that stays small.
"""
from __future__ import annotations

import ast
import importlib
import inspect
from functools import cache
from pathlib import Path

import pytest

from support import REPO

FOLDERS = {"optrace": "optrace", "bpf": "optrace.bpf", "frontend": "optrace.frontend",
           "jitmaps": "optrace.jitmaps", "exporters": "optrace.exporters"}
# folder -> the optrace packages its files may import (besides their own folder and the core)
ALLOWED = {
    "optrace": set(),
    "bpf": set(),
    "jitmaps": set(),
    # the models outputs print (frontend/report holds only pure models), and the JIT files jit show lists
    "exporters": {"optrace.frontend.report", "optrace.jitmaps"},
    "frontend": {"optrace.bpf", "optrace.jitmaps", "optrace.exporters"},
}
# frontend/'s units (a package, or a module of frontend/ itself), lowest first: a unit imports only from
# units of lower layers. A new unit goes in a layer here: where it stands is a decision, not an accident.
FRONTEND_LAYERS = (
    # pure models, file readers, leaf helpers
    {"report", "symbols", "target", "stopsignals", "preflight", "startpriority"},
    {"unwind", "uprobes", "loopwait", "cliopts"},
    # runtimes read from outside (docs/runtimes.md): CPython, HotSpot, their interface and registry (they read
    # ELF files, unwind tables, process memory)
    {"runtimes"},
    {"session"},
    {"codecapture"},
    {"recorder", "top", "serve"},  # the three users of a profiling session
    {"commands"},  # one module per command: parses options, calls the layers below, writes through formats
    {"cli"},
)
# frontend imports from exporters only the registry, and serve the pprof and OTLP encoders (its
# /debug/pprof/profile answers with pprof bytes, its OTLP push sends requests: not reports on a stream)
FRONTEND_FROM_EXPORTERS = {"optrace.exporters.formats", "optrace.exporters.pprof", "optrace.exporters.otlp"}
PURE_MODELS = "optrace.frontend.report"  # imports only the core and jitmaps' file models
COMMANDS = "optrace.frontend.commands"
EXPORTER_HELPERS = {"formats", "budget"}  # the registry and the report writers' output budget
# The session's size (issue 37: 773 lines, ProfilingSession 41 methods, SessionOptions 13 booleans that
# three users set in 3 combinations); the booleans a user may still switch within a mode: stacks, python
MAX_SESSION_LINES = 680
MAX_SESSION_METHODS = 32
MAX_SESSION_SWITCHES = 2
MALFORMED_INPUT = ("optrace.frontend.symbols.elffile.ElfFormatError", "optrace.frontend.symbols.leb128.DwarfError",
                   "optrace.schema.SchemaError", "optrace.jitmaps.jitdump.JitDumpError", "optrace.bpf.btf.BtfError",
                   "optrace.bpf.compiled.CompiledError", "optrace.bpf.typedesc.TypeDescError")


def product_files() -> list[tuple[str, Path]]:
    return [(folder, path) for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))]


@cache
def product_modules() -> frozenset[str]:
    """Every module and package of the optrace namespace, by its dotted name."""
    names = set()
    for folder, path in product_files():
        name = module_name(folder, path)
        names.add(name.removesuffix(".__init__"))
    return frozenset(names)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and node.value in product_modules():
            found.add(node.value)  # importlib.import_module("optrace...."), a registry's module name
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            start = str(node.values[0].value).removesuffix(".")
            if start in product_modules():
                found.add(start)  # f"optrace.frontend.commands.{name}": that package
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


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_core_module(module: str) -> bool:
    """optrace/'s own modules (and names imported from them), which every folder may import."""
    return module in product_modules() or module.rsplit(".", 1)[0] in product_modules()


def frontend_unit(module: str) -> str | None:
    """The unit of frontend/ a module belongs to: its package (symbols, serve...) or its own name."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["optrace", "frontend"] else None


def command_of(module: str) -> str | None:
    """optrace.frontend.commands.record[.name] -> record."""
    parts = module.split(".")
    return parts[3] if len(parts) > 3 and within(module, COMMANDS) else None


def frontend_layer(unit: str) -> int | None:
    return next((index for index, units in enumerate(FRONTEND_LAYERS) if unit in units), None)


def folder_violation(folder: str, here: str, module: str) -> str | None:
    target = owner(module)
    if target == folder:
        return None
    if target == "optrace":
        return None if is_core_module(module) else f"{module} (not a core module)"
    if not any(within(module, p) for p in ALLOWED[folder]):
        return module
    if folder == "frontend" and target == "exporters" and not any(within(module, p) for p in FRONTEND_FROM_EXPORTERS):
        return f"{module} (frontend reaches a writer through optrace.exporters.formats)"
    if within(here, PURE_MODELS) and target not in ("optrace", "jitmaps"):
        return f"{module} (frontend/report holds pure models: the core and jitmaps' models only)"
    if within(here, COMMANDS) and target == "bpf":
        return f"{module} (a command is thin: BPF is loaded by the session, the recorder or the counter)"
    return None


def frontend_violation(here: str, module: str) -> str | None:
    """The layers of frontend/, and the commands' own rules."""
    mine, theirs = frontend_unit(here), frontend_unit(module)
    if mine is None or theirs is None or theirs == "__init__":
        return None
    if mine == theirs:
        if mine == "commands" and command_of(module) not in (None, command_of(here)):
            return f"{module} (a command imports no other command: shared options go to frontend/cliopts.py)"
        return None
    layer, their_layer = frontend_layer(mine), frontend_layer(theirs)
    if layer is None or their_layer is None:
        unknown = mine if layer is None else theirs
        return f"{module} (frontend/{unknown} is in no layer of FRONTEND_LAYERS: put it in one)"
    if their_layer >= layer:
        return f"{module} (frontend/{mine} may import only from the layers below it, not frontend/{theirs})"
    return None


def violations(folder: str, path: Path) -> list[str]:
    bad = []
    here = module_name(folder, path) if path.is_relative_to(REPO / folder) else FOLDERS[folder]
    for module in sorted(imported_modules(path)):
        problem = folder_violation(folder, here, module) or (
            frontend_violation(here, module) if folder == "frontend" else None)
        if problem:
            bad.append(problem)
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


def test_the_check_counts_imports_made_through_importlib(tmp_path: Path) -> None:
    lazy = tmp_path / "lazy.py"
    lazy.write_text('import importlib\nimportlib.import_module("optrace.frontend.recorder")\n'
                    'FORMATS = {"x": "optrace.frontend.session"}\n'
                    'def command(name):\n    return importlib.import_module(f"optrace.frontend.commands.{name}")\n'
                    '"""A docstring that names optrace.frontend.session in a sentence is not an import."""\n')
    assert imported_modules(lazy) == {"optrace.frontend.recorder", "optrace.frontend.session",
                                      "optrace.frontend.commands"}
    assert violations("exporters", lazy) == ["optrace.frontend.commands", "optrace.frontend.recorder",
                                             "optrace.frontend.session"]


def test_the_check_sees_the_rules_inside_frontend(tmp_path: Path) -> None:
    symbols = REPO / "frontend" / "symbols" / "x.py"
    report = REPO / "frontend" / "report" / "x.py"
    command = REPO / "frontend" / "commands" / "top.py"
    probe = tmp_path / "probe.py"
    cases = {
        (symbols, "optrace.frontend.unwind.cfi"): "may import only from the layers below",
        (report, "optrace.frontend.commands.record"): "may import only from the layers below",
        (report, "optrace.bpf.profiler"): "pure models",
        (command, "optrace.frontend.commands.record"): "a command imports no other command",
        (REPO / "frontend" / "top" / "screen.py", "optrace.exporters.toptext"): "through optrace.exporters.formats",
        (REPO / "frontend" / "uprobes" / "counter.py", "optrace.frontend.doctor"): "in no layer",
    }
    for (where, module), problem in cases.items():
        probe.write_text(f"import {module}\n")
        here = module_name("frontend", where)
        found = [folder_violation("frontend", here, m) or frontend_violation(here, m) for m in imported_modules(probe)]
        assert any(found_problem and problem in found_problem for found_problem in found), (where, module, found)
    assert frontend_violation(module_name("frontend", command), "optrace.frontend.commands.top") is None


def function_nodes() -> list[tuple[str, ast.FunctionDef]]:
    return [(f"{module_name(folder, path)}.{node.name}", node) for folder, path in product_files()
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)]


def is_containment(function: ast.FunctionDef) -> bool:
    """A function whose body tries one returned call and, on any Exception, gives None: a copy of
    optrace.containment.contain."""
    tries = [node for node in function.body if isinstance(node, ast.Try)]
    for node in tries:
        broad = [h for h in node.handlers if isinstance(h.type, ast.Name) and h.type.id == "Exception"]
        returns_call = len(node.body) == 1 and isinstance(node.body[0], ast.Return) and \
            isinstance(node.body[0].value, ast.Call)
        gives_none = any(isinstance(s, ast.Return) and (s.value is None or getattr(s.value, "value", 0) is None)
                         for h in broad for s in h.body)
        if broad and returns_call and gives_none:
            return True
    return False


def test_one_containment_helper() -> None:
    """A failure is contained by optrace.containment.contain, not by another copy of it."""
    copies = sorted(name for name, node in function_nodes() if is_containment(node))
    assert copies == ["optrace.containment.contain"], copies


@pytest.mark.parametrize("name", MALFORMED_INPUT)
def test_malformed_input_has_one_base(name: str) -> None:
    from optrace.errors import MalformedInput

    module, _, cls = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), cls), MalformedInput)


def test_no_other_error_derives_from_value_error_itself() -> None:
    """A product error that is a ValueError is malformed input: it derives from MalformedInput, so the
    boundaries that catch malformed input catch it."""
    direct = sorted(f"{module_name(folder, path)}.{node.name}" for folder, path in product_files()
                    for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                    and any(isinstance(base, ast.Name) and base.id == "ValueError" for base in node.bases))
    assert direct == ["optrace.errors.MalformedInput"], direct


def constant_text(node: ast.AST) -> str:
    """A string argument's constant parts ("/proc//maps" for f"/proc/{pid}/maps")."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(str(part.value) for part in node.values if isinstance(part, ast.Constant))
    return ""


def opens_maps(node: ast.AST) -> bool:
    """A call of open() (builtin, os.open, io.open...) on a path that ends in /maps."""
    if not (isinstance(node, ast.Call) and node.args):
        return False
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    return name == "open" and constant_text(node.args[0]).endswith("/maps")


def test_one_reader_of_process_maps() -> None:
    """/proc/PID/maps is read by optrace.procfs.read_maps only; everyone else asks it."""
    readers = sorted({module_name(folder, path) for folder, path in product_files()
                      for node in ast.walk(ast.parse(path.read_text())) if opens_maps(node)})
    assert readers == ["optrace.procfs"], readers


THREAD_CREDENTIALS = ("setfsuid", "setfsgid", "SETFSUID", "SETFSGID", "CAPSET")


def test_one_place_takes_another_users_credentials() -> None:
    """A thread takes a process's credentials (to open a file for it) in optrace.credentials.run_as only:
    one place that switches ids per thread and checks what it holds."""
    takers = sorted({module_name(folder, path) for folder, path in product_files()
                     if any(name in path.read_text() for name in THREAD_CREDENTIALS)})
    assert takers == ["optrace.credentials"], takers


def test_exporters_hold_only_the_registry_writers() -> None:
    """exporters/ is the formats' writers, each registered, each ``write(stream, model, options)``, and
    the registry with its helper: no engine of a command lives there."""
    from optrace.exporters import formats

    registered = {module for table in vars(formats).values() if isinstance(table, formats.Formats)
                  for module in table._modules.values()}
    modules = {path.stem for path in (REPO / "exporters").glob("*.py")} - {"__init__"}
    unregistered = sorted(m for m in modules - EXPORTER_HELPERS if f"optrace.exporters.{m}" not in registered)
    assert unregistered == [], f"exporters/ holds modules that are not formats: {unregistered}"
    for module in sorted(registered):
        parameters = list(inspect.signature(importlib.import_module(module).write).parameters)
        assert len(parameters) == 3 and parameters[2] == "options", (module, parameters)


def class_node(path: Path, name: str) -> ast.ClassDef:
    return next(node for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef) and node.name == name)


def test_the_session_stays_small() -> None:
    """frontend/session.py is one session's pipeline: when processes get their unwind tables is
    frontend/unwind/scheduler.py's, and what follows from being record, serve or top is a SessionMode, so
    SessionOptions holds only what a user chooses within a mode (no new boolean there: a mode's setting)."""
    path = REPO / "frontend" / "session.py"
    lines = len(path.read_text().splitlines())
    methods = [n.name for n in class_node(path, "ProfilingSession").body if isinstance(n, ast.FunctionDef)]
    switches = [n.target.id for n in class_node(path, "SessionOptions").body if isinstance(n, ast.AnnAssign)
                and "bool" in ast.unparse(n.annotation).split(" | ")]
    assert lines <= MAX_SESSION_LINES, f"frontend/session.py has {lines} lines"
    assert len(methods) <= MAX_SESSION_METHODS, f"ProfilingSession has {len(methods)} methods: {methods}"
    assert len(switches) <= MAX_SESSION_SWITCHES, f"SessionOptions' booleans: {switches} (a mode's go to SessionMode)"


# A runtime's own modules outside frontend/runtimes/<name>/ (its BPF side and the layout its C walker shares)
RUNTIME_MODULES = {"cpython": ("optrace.frontend.runtimes.cpython", "optrace.pythonlayout", "optrace.bpf.pythonmaps"),
                   "hotspot": ("optrace.frontend.runtimes.hotspot",)}
REGISTRY = "optrace.frontend.runtimes.registry"
# Product modules that still name CPython by hand: its BPF walker called from the native walker (bpf/profiler.py
# loads it, bpf/unwindmaps.py reads its statuses; bpf/python.c, python_walk.h, copypython.c are C). Issue 44
# item 1's BPF dispatch by address range and generated layouts take them behind the seam: this list only shrinks.
NAMING_A_RUNTIME_BY_HAND = {"optrace.bpf.profiler", "optrace.bpf.unwindmaps"}
# Format 3's frames, counts and sources were CPython's (its only runtime): reading them names it
FORMAT_HISTORY = {"optrace.recordupgrade"}


def runtime_of_module(module: str) -> str | None:
    return next((name for name, own in RUNTIME_MODULES.items() if any(within(module, m) for m in own)), None)


def runtimes_named(path: Path, module: str) -> set[str]:
    """The runtimes a product module names: by importing one of their modules, or by an identifier or a string
    holding a runtime's name (``CPYTHON``, ``"hotspot"``). Prose (comments, docstrings) may name any."""
    found = {runtime_of_module(imported) for imported in imported_modules(path)} - {None}
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    words = [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)]
    words += [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    words += [node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    words += [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and len(node.value) < 40]
    found |= {name for name in RUNTIME_MODULES if any(name in word.lower() for word in words)}
    own = runtime_of_module(module)
    return found - {own} if own else found


def modules_naming_runtimes() -> dict[str, set[str]]:
    named = {}
    for folder, path in product_files():
        module = module_name(folder, path)
        runtimes = runtimes_named(path, module)
        if runtimes and module != REGISTRY and module not in FORMAT_HISTORY:
            named[module] = runtimes
    return named


def test_a_runtime_is_named_only_in_its_folders_and_the_registry() -> None:
    """The session, the scheduler, the symbolizer, the recorder and the exporters ask the registry
    (frontend/runtimes/registry.py), which names the runtimes; a runtime's modules name only themselves and the
    seam (frontend/runtimes/runtime.py). Those still wired by hand are listed, and the list only shrinks."""
    named = modules_naming_runtimes()
    assert sorted(set(named) - NAMING_A_RUNTIME_BY_HAND) == [], named
    assert sorted(NAMING_A_RUNTIME_BY_HAND - set(named)) == [], "behind the seam now: take them off the list"


def test_the_runtime_rule_sees_a_module_naming_a_runtime(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    for text in ("from optrace.frontend.runtimes.cpython.processes import PythonProcesses\n",
                 "from optrace.pythonlayout import python_frame_word\n", "KIND = 'cpython'\n",
                 "def f(session):\n    return session.hotspot_part\n"):
        probe.write_text(text)
        assert runtimes_named(probe, "optrace.frontend.recorder"), text
    probe.write_text('"""CPython and HotSpot in prose are fine."""\n# so is cpython here\nKIND = "native"\n')
    assert not runtimes_named(probe, "optrace.frontend.recorder")
    probe.write_text("from optrace.frontend.runtimes.cpython.outcomes import runtime_counts\n")
    assert not runtimes_named(probe, "optrace.frontend.runtimes.cpython.runtime")
