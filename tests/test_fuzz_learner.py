"""Property: whatever is done to a learner's files, `sb evaluate` answers in one sentence or works.

Hypothesis mutates ``learner.json`` (any field set to any JSON value, deleted, bytes flipped,
truncated, replaced), the safetensors headers of the model and the memory (any header field set,
the header length claimed, ...) and their tensors (retyped, reshaped, a value set to NaN,
infinity or an out-of-range label, data bytes flipped), and in half the examples re-records the
changed files' hashes in ``learner.json`` as a crafted learner would, so that the structural checks
behind the hashes are what answers. Every time, the command either works
(the mutation was harmless) or exits 1 with one line that is an expected failure (never a
traceback, never "Unexpected error"), and the learner's bytes are unchanged.

A second property damages the structure the hashes in ``learner.json`` guard: a symbolic link
(``steps/``, the step folder, ``learner.json``, a step file), the step folder or one of its files
swapped for another learner's (same classes and shapes, other weights), a bit flipped in tensor
data (after the header), a tail zeroed or cut. Whenever the bytes changed, `sb evaluate` refuses in
one sentence (naming the link or the file that differs from its record) and nothing, inside the
learner or behind a link, changes. A third pushes the learner to a local Hub repository that no zoo
index lists, damaged the same way, and checks that `sb pull` fails and installs nothing.

The default run tries ``SBCLI_FUZZ_EXAMPLES`` examples (25; a third of them for the pulls); a thorough run is 500 or more::

    SBCLI_FUZZ_EXAMPLES=500 python -m pytest tests/test_fuzz_learner.py -q -s
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
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
from learner_files import hashes, learner_files, read_raw, rehash, write_raw
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
def pristine(one_task_learner) -> Path:
    """The session's trained one-task learner (conftest.py): copied before any mutation, never written."""
    torch.set_num_threads(1)
    return one_task_learner


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
@given(m=mutations, as_json=st.booleans(), rehashed=st.booleans())
def test_any_mutation_is_answered_in_one_sentence_and_changes_nothing(pristine, m, as_json, rehashed):
    with tempfile.TemporaryDirectory() as tmp:
        learner = Path(tmp) / "learner"
        shutil.copytree(pristine, learner)
        mutate(learner_files(learner), m)
        if rehashed:  # as a crafted learner would: the structural checks behind the hashes answer
            rehash(learner)
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


# -- structural damage: links, swapped step files, flipped tensor data, damaged tails ---------------------

STEP_KEYS = {"model": "model.safetensors", "memory": "memory.safetensors", "test_sample": "test-sample.safetensors"}
STEP_FILE = st.sampled_from(sorted(STEP_KEYS))
structural = st.one_of(
    st.tuples(st.just("link"), st.sampled_from(["steps", "step", "json", *sorted(STEP_KEYS)])),
    st.tuples(st.just("swap-step")),
    st.tuples(st.just("swap-file"), STEP_FILE),
    st.tuples(st.just("data-flip"), STEP_FILE, fraction, st.integers(0, 7)),
    st.tuples(st.just("zero-tail"), STEP_FILE, st.integers(1, 4096)),
    st.tuples(st.just("truncate-tail"), STEP_FILE, st.integers(1, 4096)),
)
STRUCTURAL: Counter[str] = Counter()
REPO_NUMBERS = itertools.count()


@pytest.fixture(scope="module")
def other(pristine, tmp_path_factory) -> Path:
    """Another learner of the same classes and shapes, other weights: its step passes every structural check."""
    from sbcli.learner.state import Learner

    learner = Learner.load(pristine)
    with torch.no_grad():
        next(iter(learner.model.parameters())).view(-1)[0] += 1.0
    out = tmp_path_factory.mktemp("other") / "learner"
    learner.save(out)
    return out


def step_dir(learner: Path) -> Path:
    return learner / Path(json.loads((learner / "learner.json").read_text())["files"]["model"]).parent


def damage_data(path: Path, kind: str, at: float, n: int) -> None:
    """Flip a bit of the tensor data (after the header), or zero or cut the file's last ``n`` bytes."""
    raw = bytearray(path.read_bytes())
    if kind == "data-flip":
        _, data = read_raw(path)
        start = len(raw) - len(data)
        raw[start + min(int(at * len(data)), len(data) - 1)] ^= 1 << n
    elif kind == "zero-tail":
        raw[-n:] = bytes(min(n, len(raw)))
    else:
        del raw[-n:]
    path.write_bytes(bytes(raw))


def damage(learner: Path, other: Path, outside: Path, m: tuple) -> Path | None:
    """Apply structural damage ``m``; returns what now lies outside the learner behind a link (None: no link)."""
    step = step_dir(learner)
    kind = m[0]
    if kind == "link":
        rel = {"steps": learner / "steps", "step": step, "json": learner / "learner.json"}.get(m[1]) \
            or step / STEP_KEYS[m[1]]
        shutil.move(rel, outside)
        rel.symlink_to(outside, target_is_directory=outside.is_dir())
        return outside
    if kind == "swap-step":
        shutil.rmtree(step)
        shutil.copytree(step_dir(other), step)
    elif kind == "swap-file":
        shutil.copyfile(step_dir(other) / STEP_KEYS[m[1]], step / STEP_KEYS[m[1]])
    else:
        damage_data(step / STEP_KEYS[m[1]], kind, m[2] if kind == "data-flip" else 0.0, m[-1])
    return None


def _tree(path: Path) -> dict[str, str]:
    return hashes(path) if path.is_dir() else {"": hashlib.sha256(path.read_bytes()).hexdigest()}


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(m=structural)
def test_structural_damage_is_refused_by_the_recorded_hashes_and_links_are_never_followed(pristine, other, m):
    check_structural(pristine, other, m)


FINITE = [("link", t) for t in ["steps", "step", "json", *sorted(STEP_KEYS)]] + [("swap-step",)] \
    + [("swap-file", k) for k in sorted(STEP_KEYS)]


@pytest.mark.parametrize("m", FINITE, ids=["-".join(m) for m in FINITE])
def test_every_link_and_swap_is_refused(pristine, other, m):
    """The structural cases with few variants, each once (hypothesis draws them unevenly)."""
    check_structural(pristine, other, m)


def check_structural(pristine: Path, other: Path, m: tuple) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        learner = Path(tmp) / "learner"
        shutil.copytree(pristine, learner)
        original = hashes(learner)
        behind = damage(learner, other, Path(tmp) / "outside", m)
        changed = behind is not None or hashes(learner) != original
        before = hashes(learner), behind and _tree(behind)
        with _inside(Path(tmp)):
            res = runner.invoke(app, ["evaluate", str(learner), "--device", "cpu"])
        after = hashes(learner), behind and _tree(behind)
    assert after == before, m
    assert "Traceback" not in res.output and "Unexpected error" not in res.stderr, (m, res.stderr)
    lines = res.stderr.strip().splitlines()
    if not changed:  # e.g. a tail zeroed that was zeros already, a file swapped for an identical one
        assert res.exit_code == 0, (m, res.output)
        STRUCTURAL["identical bytes, worked"] += 1
        return
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error:"), (m, res.output)
    expected = "symbolic link" if behind is not None else "is not the file learner.json recorded"
    assert expected in lines[0], (m, lines[0])
    STRUCTURAL[f"{m[0]}: refused in one sentence"] += 1


PULL_EXAMPLES = max(3, EXAMPLES // 3)
pull_damage = st.one_of(
    st.tuples(st.just("data-flip"), STEP_FILE, fraction, st.integers(0, 7)),
    st.tuples(st.just("zero-tail"), STEP_FILE, st.integers(1, 4096)),
    st.tuples(st.just("truncate-tail"), STEP_FILE, st.integers(1, 4096)),
)


@pytest.fixture(scope="module")
def hub_repo(pristine, tmp_path_factory):
    """A FakeHub for the module and the pristine learner as pushed (files at the root)."""
    from conftest_hub import point_hub_client_at
    from fake_hub import FakeHub

    from sbcli.learner.state import Learner

    root = tmp_path_factory.mktemp("hub")
    Learner.load(pristine).publish(root / "flat")
    with pytest.MonkeyPatch.context() as mp, FakeHub() as hub:
        point_hub_client_at(mp, hub.endpoint, root / "hf_home")
        yield hub, root / "flat"


@settings(max_examples=PULL_EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=pull_damage)
def test_a_damaged_pull_from_outside_the_zoo_fails_and_installs_nothing(hub_repo, m):
    import huggingface_hub as hf

    from sbcli import api
    from sbcli.errors import LearnerError

    _, flat = hub_repo
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "flat"
        shutil.copytree(flat, folder)
        path = folder / STEP_KEYS[m[1]]
        raw = path.read_bytes()
        damage_data(path, m[0], m[2] if m[0] == "data-flip" else 0.0, m[-1])
        changed = path.read_bytes() != raw
        repo = f"tester/damaged-{next(REPO_NUMBERS)}"
        hf.HfApi().create_repo(repo)
        hf.HfApi().upload_folder(folder_path=str(folder), repo_id=repo)
        try:
            api.pull(repo, Path(tmp) / "pulled")
            failed = None
        except LearnerError as err:
            failed = str(err)
        left = sorted(p.name for p in Path(tmp).iterdir())
    if not changed:
        assert failed is None, (m, failed)
        STRUCTURAL["pull of identical bytes, installed"] += 1
        return
    assert failed is not None and "is not the file learner.json recorded" in failed, (m, failed)
    assert left == ["flat"], (m, left)  # nothing installed, no temporary left
    STRUCTURAL[f"pull {m[0]}: failed, nothing installed"] += 1


def teardown_module() -> None:
    if STRUCTURAL:
        print("\nstructural damage: " + "; ".join(f"{k}: {v}" for k, v in sorted(STRUCTURAL.items())))
    if OUTCOMES:
        print(f"\nfuzzed learners: {sum(v for k, v in OUTCOMES.items() if not k.startswith('learners'))}; "
              + "; ".join(f"{k}: {v}" for k, v in sorted(OUTCOMES.items())) + "; tracebacks: 0")
