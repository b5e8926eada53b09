"""Property: whatever is done to a learner's files, `sb evaluate` answers in one sentence or works.

Hypothesis mutates ``learner.json`` (any field set to any JSON value, deleted, bytes flipped,
truncated, replaced), the safetensors headers of the model and the memory (any header field set,
the header length claimed, ...) and their tensors (retyped, reshaped, a value set to NaN,
infinity or an out-of-range label, data bytes flipped). Every time, the command either works
(the mutation was harmless) or exits 1 with one line that is an expected failure (never a
traceback, never "Unexpected error"), and the learner's bytes are unchanged.

The default run tries ``SBCLI_FUZZ_EXAMPLES`` examples (25); a thorough run is 500 or more::

    SBCLI_FUZZ_EXAMPLES=500 python -m pytest tests/test_fuzz_learner.py -q -s
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from learner_files import hashes, learner_files, read_raw, train_tiny, write_raw
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from sbcli.cli.app import app

EXAMPLES = int(os.environ.get("SBCLI_FUZZ_EXAMPLES", "25"))
OUTCOMES: Counter[str] = Counter()
runner = CliRunner()

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, 2, 7, 16, 2**31, 2**62]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(alphabet="abcxyz019_-.", max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text("abcxyz_", max_size=8), inner, max_size=4)),
                           max_leaves=8)
selector = st.integers(0, 10**6)
fraction = st.floats(0, 1)
FILE = st.sampled_from(["json", "model", "memory"])
TENSOR_FILE = st.sampled_from(["model", "memory"])
DTYPES = [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.int8, torch.bool]
SPECIAL = [float("nan"), float("inf"), -float("inf"), 1e30, -1.0, 255, 2, 99, -(2**40)]

mutations = st.one_of(
    st.tuples(st.just("json-set"), selector, json_values),
    st.tuples(st.just("json-delete"), selector),
    st.tuples(st.just("header-set"), TENSOR_FILE, selector, json_values),
    st.tuples(st.just("header-length"), TENSOR_FILE, st.integers(0, 2**64 - 1)),
    st.tuples(st.just("retype"), TENSOR_FILE, selector, st.sampled_from(DTYPES)),
    st.tuples(st.just("reshape"), TENSOR_FILE, selector, st.lists(st.integers(0, 40), max_size=5)),
    st.tuples(st.just("value"), TENSOR_FILE, selector, st.sampled_from(SPECIAL)),
    st.tuples(st.just("drop-tensor"), TENSOR_FILE, selector),
    st.tuples(st.just("flip"), FILE, fraction, st.integers(1, 255)),
    st.tuples(st.just("truncate"), FILE, fraction),
    st.tuples(st.just("replace"), FILE, st.binary(max_size=64)),
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON tree (the root excluded), in a fixed order."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        out.append((*prefix, key))
        out += _paths(child, (*prefix, key))
    return out


def _pick(tree: Any, index: int) -> tuple[Any, Any] | None:
    """(parent, key) of the index-th path of ``tree`` (modulo their number)."""
    paths = _paths(tree)
    if not paths:
        return None
    path = paths[index % len(paths)]
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    return parent, path[-1]


def _edit_tree(tree: Any, index: int, value: Any = None, delete: bool = False) -> Any:
    picked = _pick(tree, index)
    if picked is not None:
        parent, key = picked
        if delete:
            del parent[key]
        else:
            parent[key] = value
    return tree


def _fit(value: float, dtype: torch.dtype) -> float | int | bool:
    """``value`` as an element of ``dtype`` (integers clamped to its range, NaN and infinities to 0)."""
    if dtype.is_floating_point:
        return value
    if not math.isfinite(value):
        return 0
    if dtype == torch.bool:
        return bool(value)
    info = torch.iinfo(dtype)
    return int(max(min(value, info.max), info.min))


def _tensor_edit(path: Path, kind: str, index: int, arg: Any) -> None:
    tensors = load_file(str(path))
    if not tensors:
        return
    name = sorted(tensors)[index % len(tensors)]
    t = tensors[name]
    if kind == "retype":
        tensors[name] = t.to(arg)
    elif kind == "reshape":
        tensors[name] = torch.zeros(arg, dtype=t.dtype)
    elif kind == "value" and t.numel():
        flat = t.flatten().clone()
        flat[index % flat.numel()] = _fit(arg, t.dtype)
        tensors[name] = flat.reshape(t.shape)
    elif kind == "drop-tensor":
        del tensors[name]
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def mutate(files: dict[str, Path], m: tuple) -> None:
    kind = m[0]
    if kind in ("json-set", "json-delete"):
        state = json.loads(files["json"].read_text())
        _edit_tree(state, m[1], m[2] if kind == "json-set" else None, delete=kind == "json-delete")
        files["json"].write_text(json.dumps(state, allow_nan=True))
    elif kind == "header-set":
        header, data = read_raw(files[m[1]])
        write_raw(files[m[1]], _edit_tree(header, m[2], m[3]), data)
    elif kind == "header-length":
        raw = files[m[1]].read_bytes()
        files[m[1]].write_bytes(struct.pack("<Q", m[2]) + raw[8:])
    elif kind in ("retype", "reshape", "value", "drop-tensor"):
        _tensor_edit(files[m[1]], kind, m[2], m[3] if len(m) > 3 else None)
    elif kind == "flip":
        raw = bytearray(files[m[1]].read_bytes())
        at = min(int(m[2] * len(raw)), len(raw) - 1)
        raw[at] ^= m[3]
        files[m[1]].write_bytes(bytes(raw))
    elif kind == "truncate":
        raw = files[m[1]].read_bytes()
        files[m[1]].write_bytes(raw[: int(m[2] * len(raw))])
    elif kind == "replace":
        files[m[1]].write_bytes(m[2])


@pytest.fixture(scope="module")
def pristine(color_data, tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return train_tiny(color_data, tmp_path_factory.mktemp("fuzz") / "learner")


@contextlib.contextmanager
def _inside(folder: Path):
    """Run with ``folder`` as the working directory: a mutated relative source path reads nothing else."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(m=mutations, as_json=st.booleans())
def test_any_mutation_is_answered_in_one_sentence_and_changes_nothing(pristine, m, as_json):
    with tempfile.TemporaryDirectory() as tmp:
        learner = Path(tmp) / "learner"
        shutil.copytree(pristine, learner)
        mutate(learner_files(learner), m)
        before = hashes(learner)
        with _inside(Path(tmp)):
            res = runner.invoke(app, ["evaluate", str(learner), "--device", "cpu", *(["--json"] if as_json else [])])
        after = hashes(learner)
    assert after == before, m
    assert "Traceback" not in res.output and "Unexpected error" not in res.stderr, (m, res.stderr)
    assert res.exception is None or isinstance(res.exception, SystemExit), (m, repr(res.exception))
    if res.exit_code == 0:
        OUTCOMES["worked (harmless mutation)"] += 1
        assert json.loads(res.stdout)["classes"] >= 1 if as_json else "Accuracy" in res.stdout
    else:
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error:"), (m, res.stderr)
        OUTCOMES["refused in one sentence"] += 1
    OUTCOMES["learners unchanged (hashes compared)"] += 1


def teardown_module() -> None:
    if OUTCOMES:
        print(f"\nfuzzed learners: {sum(v for k, v in OUTCOMES.items() if not k.startswith('learners'))}; "
              + "; ".join(f"{k}: {v}" for k, v in sorted(OUTCOMES.items())) + "; tracebacks: 0")
