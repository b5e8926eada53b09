"""The shape of the house: every module of sbcli is under a rule, imports run one way, never in a circle.

Direction rules (each folder's job: README.md, "Layout"):

- ``serve`` imports neither torch nor anything of sbcli above it (only itself, ``errors``,
  ``data.rgb`` and ``data.pixels``): an exported model is served with onnxruntime, numpy and Pillow;
- ``data`` is below everything: it imports only itself, ``errors``, ``atomic`` and ``source_kinds``;
- ``watch`` (who watches a run: the watcher protocol, the experiment logs) imports only itself and
  ``errors``: the engine tells its events through it, and the CLI composes its watchers before torch loads;
- ``engine`` and ``nets`` never import ``methods``, ``run``, ``learner`` (nor anything above those);
- ``methods`` never imports ``run``, ``learner``, ``export`` or the API (nor anything above those);
- ``cli`` is thin: it calls the API and renders what comes back, so it imports nothing of ``run``,
  ``engine``, ``learner``, ``methods``, ``nets``, ``data`` or ``hub`` directly (what a front end needs
  around a call comes from the API; the watchers it composes from ``watch``), but for the two modules
  of :data:`EXCEPTIONS`;
- only ``cli`` imports typer or rich;
- the root's modules are leaves below every folder (:data:`ROOT_LEAVES`): each imports only the
  other leaves named there (``registry`` imports ``errors``, ``defaults`` imports ``source_kinds``; the rest import nothing of sbcli);
- ``python -m sbcli`` (``__main__``) imports only ``cli``; ``sbcli`` itself imports nothing;
- and all of it: each folder imports only folders after it in :data:`LAYERS` and the root's leaves;
  a module in a folder not in :data:`LAYERS`, or at the root and not in :data:`ROOT_LEAVES`, is
  under no rule, and that is an error too.

The graph counts every import, lazy ones inside functions too (a circle closed by a lazy import
is still a circle: each side needs the other), and imports by name: a string constant that names a
module of sbcli (``"sbcli.serve.app:app_from_env"`` for uvicorn, ``"sbcli.data"`` for
importlib.resources) is an edge like an import statement. An import by a name known only at run
time (``importlib.import_module(spec)``) is allowed only in a module of :data:`BY_NAME`, which
declares every name it may import in one tuple, each a module the CLI may import and does import (it
is the CLI that hands the name down). A package's ``__init__`` importing its own submodules is not an
edge back from them: importing ``a.b`` runs ``a/__init__`` first by Python's rules, not because
``a.b`` asked for it.

Every rule kind has a test that feeds the checker a small package with one wrong import and expects
it reported, so that a checker that sees nothing cannot pass.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "sbcli"
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
# the root's modules: leaves below every folder, each importing only the leaves named here
ROOT_LEAVES = {
    "defaults": ("source_kinds",),  # the table of per-source defaults, read by the help: which sources are the paper's
    "errors": (),  # the one family of errors a user can trigger
    "registry": ("errors",),  # an unknown or twice-registered name is an sbcli error
    "metrics": (),
    "jsonutil": (),
    "atomic": (),
    "text": (),  # user text made safe for a terminal: nothing of sbcli
    "source_kinds": (),  # the sources a run names and the kinds a task record holds, named once: nothing of sbcli
}
ENTRY_POINTS = {"__main__": ("cli",)}  # `python -m sbcli` runs the CLI
ONLY = {
    "serve": ("serve", "errors", "text", "data.rgb", "data.pixels", "data.walk"),
    "data": ("data", "errors", "atomic", "source_kinds"),
    "watch": ("watch", "errors"),
    **ROOT_LEAVES,
    **ENTRY_POINTS,
}
# imports by a name known only at run time: the module, and the tuple in it of every name it may import
BY_NAME = {
    "sbcli.serve.source": "EXPORTERS",  # a learner directory is served through the exporter the CLI names
}
TERMINAL_PACKAGES = {"typer", "rich", "click"}
# top to bottom (README.md, "Layout"); below them the root's leaves (ROOT_LEAVES), then `sbcli` itself
LAYERS = ("cli", "bench", "api", "run", "config", "hub", "export", "learner", "methods", "engine", "nets", "watch", "serve",
          "data")
KINDS = ("unplaced", "upward", "FORBIDDEN", "ONLY", "by name", "circle")
IMPORTERS = {"import_module", "__import__"}  # importlib.import_module(x), import_module(x), __import__(x)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in root.rglob("*.py")}


def declared_names(tree: ast.Module, tuple_name: str) -> list[ast.Constant] | None:
    """The string constants of the module-level tuple (or list) ``tuple_name``; None when there is none."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Tuple, ast.List)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == tuple_name for t in targets):
                items = node.value.elts
                if all(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in items):
                    return list(items)  # type: ignore[arg-type]
    return None


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The sbcli modules that ``name`` imports (``from pkg import mod`` resolves to the module), by
    statement or by a string constant naming one (``"sbcli.x.y"`` or ``"sbcli.x.y:attr"``).

    The names a module of :data:`BY_NAME` declares are not its edges: :func:`by_name_errors` checks them.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    handed_down = {id(c) for c in declared_names(tree, BY_NAME[name]) or ()} if name in BY_NAME else set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sbcli."):
            if id(node) not in handed_down:  # a module by name ("sbcli" alone is the program's name, not an import)
                found.add(node.value.partition(":")[0])
    return {m for m in found if m in known and m != name}


def dynamic_imports(path: Path) -> list[int]:
    """The lines where ``path`` imports by a name that is not written in it (an argument, not a constant
    or a loop over constants): the imports the graph cannot see."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    looped = {node.target.id for node in ast.walk(tree)
              if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, (ast.Tuple, ast.List))
              and all(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in node.iter.elts)}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""
        arg = node.args[0]
        seen = isinstance(arg, ast.Constant) or (isinstance(arg, ast.Name) and arg.id in looped)
        if func in IMPORTERS and not seen:
            lines.append(node.lineno)
    return lines


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
    """``sbcli.engine.loop`` -> ``engine``; a module at the root is its own folder (``sbcli.errors`` -> ``errors``)."""
    return name.split(".")[1] if name.count(".") else ""


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == f"sbcli.{p}" or name.startswith(f"sbcli.{p}.") for p in prefixes)


def allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    """Within ``prefixes``, or the package above one of them (``from sbcli.data import rgb`` names ``sbcli.data``)."""
    return within(name, prefixes) or any(f"sbcli.{p}".startswith(f"{name}.") for p in prefixes)


def rank(name: str) -> int | None:
    """Where a module stands, top (0: ``__main__``) to bottom (``sbcli`` itself); None: under no rule."""
    top = folder(name)
    if name == "sbcli":
        return len(LAYERS) + 2
    if top in ENTRY_POINTS and name == f"sbcli.{top}":
        return 0
    if top in LAYERS:
        return 1 + LAYERS.index(top)
    if top in ROOT_LEAVES and name == f"sbcli.{top}":
        return len(LAYERS) + 1
    return None


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """Every module under no rule: in a folder not in LAYERS, or at the root and not a leaf or an entry point."""
    return [f"{name} is under no rule (a folder for LAYERS, a root module for ROOT_LEAVES)"
            for name in sorted(graph) if rank(name) is None]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module above the importer: a folder earlier in LAYERS, or any folder from a root leaf."""
    wrong = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = rank(name), rank(target)
            if a is not None and b is not None and b < a:
                wrong.append(f"{name} imports {target}")
    return wrong


def forbidden_errors(graph: dict[str, set[str]]) -> list[str]:
    """Every import a FORBIDDEN rule names (less its EXCEPTIONS)."""
    return [f"{name} imports {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
            if folder(name) in FORBIDDEN and within(target, FORBIDDEN[folder(name)])
            and not within(target, EXCEPTIONS.get(folder(name), ()))]


def only_errors(graph: dict[str, set[str]]) -> list[str]:
    """Every import outside what an ONLY rule allows (the package ``sbcli`` itself is allowed everywhere)."""
    return [f"{name} imports {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
            if folder(name) in ONLY and target != "sbcli" and not allowed(target, ONLY[folder(name)])]


def direction_errors(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs the wrong way by a FORBIDDEN or an ONLY rule, as ``a imports b``."""
    return sorted(set(forbidden_errors(graph)) | set(only_errors(graph)))


def by_name_errors(root: Path, graph: dict[str, set[str]]) -> list[str]:
    """Imports by a run-time name: only in a module of BY_NAME, whose declared names are each a module
    of sbcli that the CLI may import and does import (the CLI hands the name down)."""
    known = modules(root)
    errors = [f"{module_name(path, root)} imports by a name it does not declare (line {line}); list the names "
              "it may import in a module-level tuple, and the module in BY_NAME"
              for path in sorted(known.values()) for line in dynamic_imports(path) if module_name(path, root) not in BY_NAME]
    cli = {target for name, targets in graph.items() if folder(name) == "cli" for target in targets}
    for name, tuple_name in sorted(BY_NAME.items()):
        if name not in known:
            continue
        declared = declared_names(ast.parse(known[name].read_text(encoding="utf-8")), tuple_name)
        if declared is None:
            errors.append(f"{name} declares no tuple {tuple_name} of the names it may import")
        for target in (c.value for c in declared or ()):
            if target not in known:
                errors.append(f"{name} may import {target}, which is not a module of sbcli")
            elif direction_errors({"sbcli.cli": {target}}) or upward_imports({"sbcli.cli": {target}}):
                errors.append(f"{name} may import {target}, which the CLI may not import to hand down")
            elif target not in cli:
                errors.append(f"{name} may import {target}, which no module of cli imports to hand down")
    return errors


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
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


def layout_errors(root: Path = ROOT) -> dict[str, list[str]]:
    """Every broken rule of the package at ``root``, by kind (:data:`KINDS`)."""
    graph = import_graph(root)
    cycle = find_cycle(graph)
    return {"unplaced": unplaced(graph), "upward": upward_imports(graph), "FORBIDDEN": forbidden_errors(graph),
            "ONLY": only_errors(graph), "by name": by_name_errors(root, graph),
            "circle": [" -> ".join(cycle)] if cycle else []}


@functools.cache
def sbcli_errors() -> dict[str, list[str]]:
    return layout_errors(ROOT)


# -- sbcli itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sbcli_breaks_no_layout_rule(kind: str) -> None:
    assert sbcli_errors()[kind] == []


def test_the_rules_name_real_folders_and_modules() -> None:
    known = modules()
    named = {p for rules in (FORBIDDEN, EXCEPTIONS, ONLY) for prefixes in rules.values() for p in prefixes}
    named |= {*FORBIDDEN, *EXCEPTIONS, *ONLY, *LAYERS, *ROOT_LEAVES, *ENTRY_POINTS}
    assert sorted(p for p in named if f"sbcli.{p}" not in known) == []
    assert sorted(n for n in BY_NAME if n not in known) == []


def test_the_graph_sees_lazy_package_and_string_imports() -> None:
    graph = import_graph()
    assert "sbcli.export.onnx" in graph["sbcli.api.shipping"]  # imported inside a function
    assert "sbcli.data.sources" in graph["sbcli.data.catalog"]  # `from sbcli.data import sources`
    assert "sbcli.serve.app" in graph["sbcli.serve.server"]  # uvicorn.run("sbcli.serve.app:app_from_env")
    assert "sbcli.errors" in graph["sbcli.registry"]


def test_serve_imports_by_name_only_the_exporters_it_declares(tmp_path: Path) -> None:
    from sbcli.errors import ConfigError
    from sbcli.serve.source import EXPORTERS, exporter_of

    assert EXPORTERS == ("sbcli.export.serving",)  # the one the CLI hands down (sb serve LEARNER)
    with pytest.raises(ConfigError, match="not an exporter"):
        exporter_of("sbcli.cli.app", tmp_path)
    assert exporter_of(EXPORTERS[0], tmp_path).__name__ == EXPORTERS[0]


def test_serve_holds_only_onnxruntime_numpy_and_pillow() -> None:
    for path in sorted((ROOT / "serve").rglob("*.py")):
        assert "torch" not in external_imports(path), f"{path.relative_to(ROOT.parent)} imports torch"


def test_only_the_cli_imports_typer_or_rich() -> None:
    known = modules()
    wrong = sorted(f"{name} imports {', '.join(sorted(external_imports(path) & TERMINAL_PACKAGES))}"
                   for name, path in known.items() if folder(name) != "cli" and external_imports(path) & TERMINAL_PACKAGES)
    assert wrong == []


# -- the checker, fed one wrong import of each kind ----------------------------------------------


def fake_sbcli(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package named sbcli under ``tmp_path`` holding ``files`` (path below it -> source); its root."""
    root = tmp_path / "sbcli"
    root.mkdir(parents=True)
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / rel
        for parent in reversed(path.relative_to(root).parents[:-1]):
            (root / parent).mkdir(parents=True, exist_ok=True)
            (root / parent / "__init__.py").touch()
        path.write_text(source, encoding="utf-8")
    return root


def only_kind(errors: dict[str, list[str]], kind: str) -> list[str]:
    """The errors of ``kind``, after checking that no other kind found any."""
    assert {k: v for k, v in errors.items() if k != kind and v} == {}
    return errors[kind]


def test_the_checker_passes_a_package_that_keeps_every_rule(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"errors.py": "", "registry.py": "from sbcli.errors import ConfigError\n",
                                 "__main__.py": "from sbcli.cli.app import main\n", "cli/app.py": "from sbcli import api\n",
                                 "api/__init__.py": "from sbcli.run import steps\n", "run/steps.py": "import sbcli.registry\n",
                                 "data/walk.py": "from sbcli import errors, __version__\n"})
    assert layout_errors(root) == {kind: [] for kind in KINDS}


def test_the_checker_catches_a_folder_importing_a_folder_above_it(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"engine/loop.py": "", "nets/resnet.py": "def f():\n    from sbcli.engine import loop\n"})
    assert only_kind(layout_errors(root), "upward") == ["sbcli.nets.resnet imports sbcli.engine",
                                                         "sbcli.nets.resnet imports sbcli.engine.loop"]


def test_the_checker_catches_a_root_leaf_importing_upward_or_another_leaf(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"cli/app.py": "", "errors.py": "from sbcli.cli import app\n",
                                 "defaults.py": "import sbcli.errors\n"})
    errors = layout_errors(root)
    assert errors["ONLY"] == ["sbcli.defaults imports sbcli.errors", "sbcli.errors imports sbcli.cli",
                              "sbcli.errors imports sbcli.cli.app"]
    assert errors["upward"] == ["sbcli.errors imports sbcli.cli", "sbcli.errors imports sbcli.cli.app"]


def test_the_checker_catches_an_import_outside_an_only_rule(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"data/catalog.py": "", "data/rgb.py": "",
                                 "serve/classifier.py": "from sbcli.data import rgb\nfrom sbcli.data.catalog import resolve\n"})
    assert only_kind(layout_errors(root), "ONLY") == ["sbcli.serve.classifier imports sbcli.data.catalog"]
    root = fake_sbcli(tmp_path / "w", {"errors.py": "", "atomic.py": "", "watch/logs.py": "import sbcli.errors\nimport sbcli.atomic\n"})
    assert only_kind(layout_errors(root), "ONLY") == ["sbcli.watch.logs imports sbcli.atomic"]


def test_the_checker_catches_an_import_a_forbidden_rule_names(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"run/plan.py": "", "engine/threads.py": "", "engine/loop.py": "",
                                 "cli/train.py": "from sbcli.engine.threads import limit\nfrom sbcli.run.plan import epochs\n",
                                 "cli/app.py": "import sbcli.engine.loop\n"})
    assert only_kind(layout_errors(root), "FORBIDDEN") == ["sbcli.cli.app imports sbcli.engine.loop",
                                                            "sbcli.cli.train imports sbcli.run.plan"]


def test_the_checker_catches_a_circle_closed_by_a_lazy_or_a_string_import(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"data/a.py": "def f():\n    from sbcli.data import b\n", "data/b.py": "import sbcli.data.a\n"})
    assert only_kind(layout_errors(root), "circle") == ["sbcli.data.a -> sbcli.data.b -> sbcli.data.a"]
    root = fake_sbcli(tmp_path / "s", {"serve/app.py": "from sbcli.serve.server import run\n",
                                       "serve/server.py": 'def run():\n    uvicorn.run("sbcli.serve.app:make")\n'})
    assert only_kind(layout_errors(root), "circle") == ["sbcli.serve.app -> sbcli.serve.server -> sbcli.serve.app"]


def test_the_checker_catches_a_module_under_no_rule(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"util.py": "", "plugins/extra.py": ""})
    assert only_kind(layout_errors(root), "unplaced") == [
        "sbcli.plugins is under no rule (a folder for LAYERS, a root module for ROOT_LEAVES)",
        "sbcli.plugins.extra is under no rule (a folder for LAYERS, a root module for ROOT_LEAVES)",
        "sbcli.util is under no rule (a folder for LAYERS, a root module for ROOT_LEAVES)"]


def test_the_checker_sees_imports_by_name(tmp_path: Path) -> None:
    root = fake_sbcli(tmp_path, {"cli/app.py": "", "serve/classifier.py": 'import importlib\nAPP = importlib.import_module("sbcli.cli.app")\n',
                                 "nets/zoo.py": "def build(name):\n    return __import__(name)\n"})
    errors = layout_errors(root)
    assert errors["ONLY"] == errors["upward"] == ["sbcli.serve.classifier imports sbcli.cli.app"]
    assert errors["by name"] == ["sbcli.nets.zoo imports by a name it does not declare (line 2); list the names it may "
                                 "import in a module-level tuple, and the module in BY_NAME"]


def test_the_checker_holds_the_declared_names_to_what_the_cli_hands_down(tmp_path: Path) -> None:
    source = 'EXPORTERS = ("sbcli.export.serving", "sbcli.run.plan", "sbcli.export.onnx", "sbcli.nowhere")\n' \
             "def exporter_of(spec):\n    return importlib.import_module(spec)\n"
    root = fake_sbcli(tmp_path, {"serve/source.py": source, "export/serving.py": "", "export/onnx.py": "", "run/plan.py": "",
                                 "cli/serve.py": "from sbcli.export.serving import EXPORTER\n"})
    assert only_kind(layout_errors(root), "by name") == [
        "sbcli.serve.source may import sbcli.run.plan, which the CLI may not import to hand down",
        "sbcli.serve.source may import sbcli.export.onnx, which no module of cli imports to hand down",
        "sbcli.serve.source may import sbcli.nowhere, which is not a module of sbcli"]
    (root / "serve" / "source.py").write_text("def exporter_of(spec):\n    return importlib.import_module(spec)\n")
    assert only_kind(layout_errors(root), "by name") == ["sbcli.serve.source declares no tuple EXPORTERS of the names it may import"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_direction_rules_catch_a_wrong_way_import() -> None:
    graph = {"sbcli.engine.loop": {"sbcli.methods.base", "sbcli.metrics"}, "sbcli.serve.classifier": {"sbcli.api"},
             "sbcli.methods.dd": {"sbcli.engine.loop", "sbcli.learner.state"}, "sbcli.data.walk": {"sbcli.errors"}}
    assert direction_errors(graph) == ["sbcli.engine.loop imports sbcli.methods.base", "sbcli.methods.dd imports sbcli.learner.state",
                                       "sbcli.serve.classifier imports sbcli.api"]


def test_the_cli_rule_catches_a_reach_past_the_api() -> None:
    graph = {"sbcli.cli.add_task": {"sbcli.api", "sbcli.watch.logs", "sbcli.errors", "sbcli.run.plan", "sbcli.learner.store.lock"},
             "sbcli.cli.app": {"sbcli.engine.threads", "sbcli.engine.distributed"},
             "sbcli.cli._options": {"sbcli.defaults", "sbcli.methods.options", "sbcli.methods"},
             "sbcli.cli.train": {"sbcli.config.options", "sbcli.engine"}}
    assert direction_errors(graph) == ["sbcli.cli._options imports sbcli.methods", "sbcli.cli.add_task imports sbcli.learner.store.lock",
                                       "sbcli.cli.add_task imports sbcli.run.plan", "sbcli.cli.app imports sbcli.engine.distributed",
                                       "sbcli.cli.train imports sbcli.engine"]
