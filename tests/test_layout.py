"""The shape of the house: imports run one way between the folders, and never in a circle.

Direction rules (each folder's job: README.md, "Layout"):

- ``serve`` imports neither torch nor anything of sbcli above it (only itself, ``errors``,
  ``data.rgb`` and ``data.pixels``): an exported model is served with onnxruntime, numpy and Pillow;
- ``data`` is below everything: it imports only itself, ``errors`` and ``atomic``;
- ``engine`` and ``nets`` never import ``methods``, ``run``, ``learner`` (nor anything above those);
- ``methods`` never imports ``run``, ``learner``, ``export`` or the API (nor anything above those);
- ``cli`` is thin: it calls the API and renders what comes back, so it imports nothing of ``run``,
  ``engine``, ``learner``, ``methods``, ``nets``, ``data`` or ``hub`` directly (what a front end needs
  around a call is in ``api.frontend``), but for the two modules of :data:`EXCEPTIONS`;
- only ``cli`` imports typer or rich;
- and all of it: each folder imports only folders after it in :data:`LAYERS` (and the root's leaves).

The graph counts every import, lazy ones inside functions too (a circle closed by a lazy import
is still a circle: each side needs the other). A package's ``__init__`` importing its own
submodules is not an edge back from them: importing ``a.b`` runs ``a/__init__`` first by Python's
rules, not because ``a.b`` asked for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "sbcli"
MAX_LINES = 600  # a soft ceiling: a module this long has more than one job
ABOVE_METHODS = ("run", "learner", "export", "api", "cli", "config", "hub", "bench", "serve")
# the sbcli modules a folder must not import (prefixes below sbcli.), and what it may import at all
FORBIDDEN = {
    "engine": ("methods", *ABOVE_METHODS),
    "nets": ("methods", *ABOVE_METHODS),
    "methods": ABOVE_METHODS,
    "cli": ("run", "engine", "learner", "methods", "nets", "data", "hub"),
}
# imports a FORBIDDEN rule lets through, each with its reason
EXCEPTIONS = {
    "cli": (
        "engine.threads",  # `sb` sets the thread and OpenMP environment before anything imports torch (the API does)
        "methods.options",  # the methods' options become CLI options as the commands are declared, torch-free
    ),
}
ONLY = {
    "serve": ("serve", "errors", "data.rgb", "data.pixels"),
    "data": ("data", "errors", "atomic"),
}
TERMINAL_PACKAGES = {"typer", "rich", "click"}
# top to bottom (README.md, "Layout"); the root's leaves (errors, registry, metrics, jsonutil, atomic) serve all
LAYERS = ("cli", "bench", "api", "run", "config", "hub", "export", "learner", "methods", "engine", "nets", "serve", "data")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The sbcli modules that ``name`` imports (``from pkg import mod`` resolves to the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in known and m != name}


def external_imports(path: Path) -> set[str]:
    """The top-level names of the packages outside sbcli that a file imports (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"sbcli"}


def folder(name: str) -> str:
    """``sbcli.engine.loop`` -> ``engine``; a module at the root is its own folder."""
    return name.split(".")[1] if name.count(".") else ""


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == f"sbcli.{p}" or name.startswith(f"sbcli.{p}.") for p in prefixes)


def allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    """Within ``prefixes``, or the package above one of them (``from sbcli.data import rgb`` names ``sbcli.data``)."""
    return within(name, prefixes) or any(f"sbcli.{p}".startswith(f"{name}.") for p in prefixes)


def direction_errors(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs the wrong way, as ``a imports b``."""
    errors = []
    for name, targets in sorted(graph.items()):
        top = folder(name)
        for target in sorted(targets):
            if target == "sbcli":  # the package itself (``from sbcli import __version__``)
                continue
            forbidden = top in FORBIDDEN and within(target, FORBIDDEN[top]) and not within(target, EXCEPTIONS.get(top, ()))
            if forbidden or (top in ONLY and not allowed(target, ONLY[top])):
                errors.append(f"{name} imports {target}")
    return errors


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_lazy_and_package_imports() -> None:
    graph = import_graph()
    assert "sbcli.export.onnx" in graph["sbcli.api.out"]  # imported inside a function
    assert "sbcli.data.sources" in graph["sbcli.data.catalog"]  # `from sbcli.data import sources`


def test_sbcli_has_no_import_circle() -> None:
    assert find_cycle(import_graph()) is None


def test_the_direction_rules_catch_a_wrong_way_import() -> None:
    graph = {"sbcli.engine.loop": {"sbcli.methods.base", "sbcli.metrics"}, "sbcli.serve.model": {"sbcli.api"},
             "sbcli.methods.dd": {"sbcli.engine.loop", "sbcli.learner.state"}, "sbcli.data.walk": {"sbcli.errors"}}
    assert direction_errors(graph) == ["sbcli.engine.loop imports sbcli.methods.base", "sbcli.methods.dd imports sbcli.learner.state",
                                       "sbcli.serve.model imports sbcli.api"]


def test_the_cli_rule_catches_a_reach_past_the_api() -> None:
    graph = {"sbcli.cli.add_task": {"sbcli.api", "sbcli.api.frontend", "sbcli.errors", "sbcli.run.plan", "sbcli.learner.store.lock"},
             "sbcli.cli.app": {"sbcli.engine.threads", "sbcli.engine.distributed"},
             "sbcli.cli._options": {"sbcli.defaults", "sbcli.methods.options", "sbcli.methods"},
             "sbcli.cli.train": {"sbcli.config.options", "sbcli.engine"}}
    assert direction_errors(graph) == ["sbcli.cli._options imports sbcli.methods", "sbcli.cli.add_task imports sbcli.learner.store.lock",
                                       "sbcli.cli.add_task imports sbcli.run.plan", "sbcli.cli.app imports sbcli.engine.distributed",
                                       "sbcli.cli.train imports sbcli.engine"]


def test_imports_run_one_way_between_the_folders() -> None:
    assert direction_errors(import_graph()) == []


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a folder by a folder below it in LAYERS."""
    wrong = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = folder(name), folder(target)
            if a in LAYERS and b in LAYERS and LAYERS.index(b) < LAYERS.index(a):
                wrong.append(f"{name} imports {target}")
    return wrong


def test_every_folder_imports_only_the_folders_below_it() -> None:
    assert upward_imports({"sbcli.run.steps": {"sbcli.engine.loop", "sbcli.errors"}}) == []
    assert upward_imports({"sbcli.engine.loop": {"sbcli.data.device", "sbcli.run.steps"}}) == [
        "sbcli.engine.loop imports sbcli.run.steps"]
    assert upward_imports(import_graph()) == []


def test_serve_holds_only_onnxruntime_numpy_and_pillow() -> None:
    for path in sorted((ROOT / "serve").rglob("*.py")):
        assert "torch" not in external_imports(path), f"{path.relative_to(ROOT.parent)} imports torch"


def test_only_the_cli_imports_typer_or_rich() -> None:
    known = modules()
    wrong = sorted(f"{name} imports {', '.join(sorted(external_imports(path) & TERMINAL_PACKAGES))}"
                   for name, path in known.items() if folder(name) != "cli" and external_imports(path) & TERMINAL_PACKAGES)
    assert wrong == []


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_grows_past_the_soft_ceiling(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT.parent)} has {lines} lines; split it into modules with one job"
