"""Count the places in the package that read a stored payload by a string key outside the payload's home.

A stored payload is a nested JSON object a learner keeps (a step's method record, phases and engine settings,
the metrics' counts, a task's data source, the pretrained backbone's provenance, a sequence's plan, the
normalisation) or one of the results the Python API hands back (``api.evaluate``'s result and the test data
it used, a history's summary). Each has a home: the module that
writes and parses it, where reading its JSON by key is the job. Everywhere else a reader should see a typed
record's attributes.

What counts, read from the syntax tree of every module of ``sbcli/`` outside :data:`HOMES` (tests and
benchmarks read learner.json as any JSON reader would, and are not counted):

- ``P["key"]`` (a subscript by a string constant, not an assignment to one), ``P.get("key", ...)`` and
  ``"key" in P`` / ``"key" not in P``,
- where ``P`` is a payload expression: an attribute named in :data:`PAYLOAD_ATTRS` (``h.record``,
  ``t.source``, ``state.plan``...), a call of a function named in :data:`PAYLOAD_CALLS`, a name a payload
  was bound to in the same function or an enclosing one (``r = h.record``, ``for p in h.phases``, a parameter
  named in :data:`PAYLOAD_ATTRS`), an item of a payload (``h.phases[0]``, ``record["test"]``), or
  ``P or {}``.

A name's type is not known to the syntax tree: an attribute named ``source`` that holds a string is never
subscripted by a key, so it adds nothing; a dict that is not a payload but shares a payload's attribute
name would count, and is then a name worth changing.

    python benchmarks/key_reads.py            # the count, then each read as path:line  expression
    python benchmarks/key_reads.py --json     # {"count": N, "reads": [...]}
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD_ATTRS = frozenset({"record", "phases", "source", "pretrained", "plan", "normalization", "train_config", "counts",
                           "test_data", "summary"})
PAYLOAD_CALLS = frozenset({"evaluate", "history_summary", "summary"})
# Each payload's home: where its JSON is written and parsed (and the learner's format is checked and migrated).
HOMES = (
    "sbcli/learner/records.py",  # history steps, tasks, provenance
    "sbcli/learner/state.py",
    "sbcli/learner/validate/",  # the checks of learner.json before it is parsed
    "sbcli/learner/store/",  # the store's own records and older formats
    "sbcli/data/source_records.py",  # a task's data source
    "sbcli/data/device.py",  # the normalisation
    "sbcli/hub/pretrained.py",  # the pretrained backbone's record
    "sbcli/run/plan.py",  # a sequence's plan
    "sbcli/engine/loop.py",  # a phase's report
    "sbcli/methods/split_bridge.py",  # Split-and-Bridge's step record
    "sbcli/methods/ranpac.py",  # a ridge head's step record
    "sbcli/methods/ridge_forget.py",  # a forget step's record
    "sbcli/run/evaluation.py",  # api.evaluate's result
    "sbcli/metrics.py",  # a history's summary
)


@dataclass(frozen=True)
class Read:
    path: str
    line: int
    code: str


def _is_payload(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in PAYLOAD_ATTRS
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if called in PAYLOAD_CALLS:
            return True
        return isinstance(func, ast.Attribute) and func.attr == "get" and _is_payload(func.value, names)
    if isinstance(node, ast.Subscript):
        return _is_payload(node.value, names)
    if isinstance(node, ast.BoolOp):
        return any(_is_payload(v, names) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _is_payload(node.body, names) or _is_payload(node.orelse, names)
    return False


def _targets(target: ast.expr) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope`` outside the functions and classes nested in it."""
    out, stack = [], list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _bound(scope: ast.AST, inherited: set[str]) -> set[str]:
    """The names a payload is bound to in ``scope`` (to a fixed point), with those of the enclosing scopes."""
    names = set(inherited)
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        names |= {a.arg for a in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs)
                  if a.arg in PAYLOAD_ATTRS}
    nodes = _own_nodes(scope)
    while True:
        before = len(names)
        for node in nodes:
            if isinstance(node, ast.Assign) and _is_payload(node.value, names):
                for target in node.targets:
                    names.update(_targets(target))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                    and _is_payload(node.value, names):
                names.update(_targets(node.target))
            elif isinstance(node, (ast.For, ast.comprehension)) and _is_payload(node.iter, names):
                names.update(_targets(node.target))
        if len(names) == before:
            return names


def _reads_in(scope: ast.AST, names: set[str], path: str, source: str) -> list[Read]:
    reads = []
    for node in _own_nodes(scope):
        hit = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                and _is_payload(node.value, names):
            hit = node
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and _is_payload(node.func.value, names):
            hit = node
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) \
                and _is_payload(node.comparators[0], names):
            hit = node
        if hit is not None:
            reads.append(Read(path, hit.lineno, ast.get_source_segment(source, hit) or ""))
    return reads


def _walk(scope: ast.AST, inherited: set[str], path: str, source: str) -> list[Read]:
    names = _bound(scope, inherited)
    reads = _reads_in(scope, names, path, source)
    for node in _own_nodes(scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            reads += _walk(node, names, path, source)
    return reads


def key_reads(root: Path = ROOT) -> list[Read]:
    """Every string-key read of a stored payload in ``root/sbcli`` outside the payloads' homes, in path order."""
    reads = []
    for file in sorted((root / "sbcli").rglob("*.py")):
        rel = file.relative_to(root).as_posix()
        if any(rel == home or (home.endswith("/") and rel.startswith(home)) for home in HOMES):
            continue
        source = file.read_text(encoding="utf-8")
        reads += _walk(ast.parse(source), set(), rel, source)
    return sorted(reads, key=lambda r: (r.path, r.line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the count and the reads as JSON")
    args = parser.parse_args(argv)
    reads = key_reads()
    if args.json:
        print(json.dumps({"count": len(reads), "reads": [asdict(r) for r in reads]}, indent=2))
    else:
        print(f"{len(reads)} string-key reads of stored payloads outside their homes "
              f"({len({r.path for r in reads})} files)")
        for r in reads:
            print(f"  {r.path}:{r.line}  {r.code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
