"""Every malformed learner file is refused at load in one sentence, the learner untouched."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from learner_files import hashes, learner_files, read_raw, rehash, write_raw
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import LearnerError
from sbcli.learner.state import Learner
from sbcli.learner.validate import read_safetensors

runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(one_task_learner) -> Path:
    """The session's trained one-task learner (conftest.py): copied before any damage, never written."""
    torch.set_num_threads(1)
    return one_task_learner


@pytest.fixture
def learner(pristine, tmp_path) -> Path:
    copy = tmp_path / "learner"
    shutil.copytree(pristine, copy)
    return copy


def _json(edit: Callable[[dict], object]) -> Callable[[dict[str, Path]], None]:
    def mutate(files: dict[str, Path]) -> None:
        state = json.loads(files["json"].read_text())
        result = edit(state)
        files["json"].write_text(json.dumps(state if result is None else result))
    return mutate


def _set(*path_and_value):
    *keys, value = path_and_value

    def edit(state: dict) -> None:
        node = state
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return _json(edit)


def _tensors(which: str, edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[dict[str, Path]], None]:
    def mutate(files: dict[str, Path]) -> None:
        tensors = load_file(str(files[which]))
        edit(tensors)
        save_file(tensors, str(files[which]))
    return mutate


def _raw(which: str, edit: Callable[[dict, bytes], tuple[dict, bytes, int | None]]) -> Callable[[dict[str, Path]], None]:
    def mutate(files: dict[str, Path]) -> None:
        header, data = read_raw(files[which])
        write_raw(files[which], *edit(header, data))
    return mutate


def _bytes(which: str, make: Callable[[bytes], bytes]) -> Callable[[dict[str, Path]], None]:
    def mutate(files: dict[str, Path]) -> None:
        files[which].write_bytes(make(files[which].read_bytes()))
    return mutate


def _shift_offsets(header: dict, data: bytes):
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 4
    return header, data, None


def _retype(dtype: torch.dtype):
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        for k, v in tensors.items():
            if v.dtype == torch.float32:
                tensors[k] = v.to(dtype)
    return edit


def _nan(tensors: dict[str, torch.Tensor]) -> None:
    tensors["conv1.weight"][0, 0, 0, 0] = float("nan")


CASES = {
    # learner.json
    "json-list": (_bytes("json", lambda b: b"[1, 2, 3]"), "not a JSON object"),
    "json-not-utf8": (_bytes("json", lambda b: b"\xff\xfe" + b), "not UTF-8"),
    "json-truncated": (_bytes("json", lambda b: b[: len(b) // 2]), "not valid JSON"),
    "json-deep": (_bytes("json", lambda b: b"[" * 100_000), "not valid JSON"),
    "format-version-string": (_set("format_version", "1"), "format_version must be a whole number"),
    "width-1e6": (_set("width", 1e6), "width must be a number above 0 up to 4.0"),
    "width-string": (_set("width", "wide"), "width must be a number"),
    "image-size-huge": (_set("image_size", 10**9), "image_size must be a whole number"),
    "class-names-number": (_set("class_names", 7), "class_names must be a list"),
    "epochs-string": (_set("train_config", "epochs", "3"), "train_config.epochs must be a whole number"),
    "budget-negative": (_set("memory", "budget", -1), "memory.budget must be a whole number"),
    "unknown-arch": (_set("arch", "resnet9000"), "arch must be one of"),
    "source-not-object": (_json(lambda s: s["tasks"][0].__setitem__("source", "x")), r"tasks\[0\].source must be"),
    "class-task-short": (_set("class_task", [0]), "class_task has 1 entries for 2 classes"),
    "method-config-unknown": (_set("method_config", "warp", 9), "method_config.warp is not a known setting"),
    # model.safetensors
    "model-truncated": (_bytes("model", lambda b: b[: len(b) // 2]), "damaged"),
    "model-random": (_bytes("model", lambda b: bytes(range(256)) * 8), "damaged"),
    "model-empty": (_bytes("model", lambda b: b""), "too short for a safetensors file"),
    "model-header-2^62": (_raw("model", lambda h, d: (h, d, 2**62)), "header claims 4611686018427387904 bytes"),
    "model-bad-offsets": (_raw("model", _shift_offsets), "damaged"),
    "model-unknown-dtype": (_raw("model", lambda h, d: ({**h, "conv1.weight": {**h["conv1.weight"], "dtype": "F8"}}, d, None)),
                            "unknown dtype"),
    "model-float16": (_tensors("model", _retype(torch.float16)), "stored as float16, not float32"),
    "model-int64": (_tensors("model", _retype(torch.int64)), "stored as int64, not float32"),
    "model-nan": (_tensors("model", _nan), "NaN or infinite"),
    "model-wrong-shape": (_tensors("model", lambda t: t.__setitem__("head.weight", torch.zeros(3, t["head.weight"].shape[1]))),
                          "head.weight has shape"),
    "model-missing-weight": (_tensors("model", lambda t: t.pop("conv1.weight")), "conv1.weight is missing"),
    # memory.safetensors
    "memory-no-labels": (_tensors("memory", lambda t: t.pop("labels")), "must hold images and labels"),
    "memory-random": (_bytes("memory", lambda b: bytes(reversed(range(256))) * 16), "damaged"),
    "memory-label-out-of-range": (_tensors("memory", lambda t: t["labels"].__setitem__(0, 99)), "outside 0..1"),
    "memory-wrong-size": (_tensors("memory", lambda t: t.__setitem__("images", t["images"][:, :, :8, :8].contiguous())),
                          "are 8x8, the learner's are 16x16"),
    "memory-float-images": (_tensors("memory", lambda t: t.__setitem__("images", t["images"].float())), "float32, not uint8"),
    "memory-int32-labels": (_tensors("memory", lambda t: t.__setitem__("labels", t["labels"].int())), "int32, not int64"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_learner_is_refused_in_one_sentence_and_left_unchanged(learner, case):
    mutate, message = CASES[case]
    mutate(learner_files(learner))
    rehash(learner)  # a crafted learner records its files' hashes: the structural checks must catch it
    before = hashes(learner)
    with pytest.raises(LearnerError, match=message) as err:
        Learner.load(learner)
    text = str(err.value)
    assert "\n" not in text and "newer" not in text
    res = runner.invoke(app, ["evaluate", str(learner), "--device", "cpu"])
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("Error:") and "Traceback" not in res.output, res.output
    assert hashes(learner) == before


def test_the_pristine_learner_loads_and_reads_as_safetensors_does(pristine):
    Learner.load(pristine)
    files = learner_files(pristine)
    ours, theirs = read_safetensors(files["model"]), load_file(str(files["model"]))
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_bundled_format_1_learner_still_loads():
    Learner.load(Path(__file__).resolve().parents[1] / "zoo" / "learners" / "demo-sb-tiny")


def test_a_recorded_source_never_downloads(learner, monkeypatch, tmp_path):
    from sbcli.data import catalog

    real, asked = catalog.sources.load_cifar, []

    def no_download(root, name, train, *, download):
        asked.append(download)
        return real(root, name, train, download=False)

    monkeypatch.setattr(catalog.sources, "load_cifar", no_download)
    root = tmp_path / "cifar-root"
    _json(lambda s: s["tasks"][0].__setitem__("source", {"kind": "cifar10", "root": str(root), "download": True}))(
        learner_files(learner))
    rehash(learner)  # recorded so, as by an older sbcli: its step's own record says the same
    before = hashes(learner)
    res = runner.invoke(app, ["evaluate", str(learner), "--device", "cpu"])
    # the recorded folder is missing: the learner's carried test sample stands in, and says so
    assert res.exit_code == 0 and "from the carried test sample" in res.stderr, res.output
    assert not any(asked)  # the recorded "download": true was not obeyed
    assert not root.exists()  # no folder made, nothing fetched
    assert hashes(learner) == before
    def drop_sample(state: dict) -> None:
        state.pop("test_sample")
        state.get("hashes", {}).pop(state["files"]["test_sample"], None)
        for files in (state["files"], *state["kept_steps"].values()):
            files.pop("test_sample")

    _json(drop_sample)(learner_files(learner))
    rehash(learner)
    res = runner.invoke(app, ["evaluate", str(learner), "--device", "cpu"])
    assert res.exit_code == 1 and "no test images to evaluate on" in res.stderr, res.output
    assert not any(asked) and not root.exists()


def test_a_missing_file_is_left_to_the_caller(tmp_path):
    # sbcli.learner.state reads learner.json again when a writer's commit removed the files it named
    with pytest.raises(FileNotFoundError):
        read_safetensors(tmp_path / "gone.safetensors")
