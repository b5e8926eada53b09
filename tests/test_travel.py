"""A learner that travels: no machine paths, the carried test sample, --data-root, the card.

One tiny learner (std, one epoch) is trained per module on copies of the colour folders; each test
copies what it changes, so the tests are independent.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub as hf
import numpy as np
import pytest
import torch
from huggingface_hub.repocard_data import model_index_to_eval_results
from learner_files import rehash
from PIL import Image
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.data.fingerprint import fingerprint
from sbcli.data.imageset import ImageSet
from sbcli.engine.loop import TrainConfig
from sbcli.errors import DataError
from sbcli.hub.card import CardFacts, eval_results, model_card
from sbcli.hub.upload import public_state
from sbcli.learner.state import Learner, read_state

RUN = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")


def train(data: Path, out: Path, **seq_options) -> Path:
    seq = api.SequenceOptions(source=str(data / "train"), test=str(data / "test"), image_size=16, tasks=1, **seq_options)
    api.train(seq, RUN, out)
    return out


@pytest.fixture(scope="module")
def trained(color_data, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("travel")
    data = root / "data" / "task1"
    shutil.copytree(color_data["task1_train"], data / "train")
    shutil.copytree(color_data["task1_test"], data / "test")
    return {"root": root, "data": data, "learner": train(data, root / "learner")}


@pytest.fixture
def moved(trained: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """A copy of the learner whose training data moved away (renamed) after training."""
    shutil.copytree(trained["learner"], tmp_path / "learner")
    shutil.copytree(trained["data"], tmp_path / "moved")
    return {"learner": tmp_path / "learner", "data": tmp_path / "moved"}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_learner_json_names_sources_without_paths(trained: dict[str, Path]) -> None:
    text = (trained["learner"] / "learner.json").read_text()
    for path in (trained["root"], trained["data"], Path.home()):
        assert str(path) not in text
    source = json.loads(text)["tasks"][0]["source"]
    assert source["kind"] == "folder" and source["name"] == "train" and source["test"]["name"] == "test"
    assert source["train"]["counts"] == [24, 24] and source["test"]["counts"] == [8, 8]
    assert len(source["test"]["sha256"]) == 64 and json.loads(text)["plan"]["source"] == source


def test_fingerprint_changes_with_one_pixel() -> None:
    images = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    base = ImageSet(images, torch.tensor([0, 0, 1, 1]), ["a", "b"])
    same = ImageSet(images.clone(), torch.tensor([0, 0, 1, 1]), ["a", "b"])
    edited = images.clone()
    edited[3, 2, 7, 7] = 1
    assert fingerprint(base) == fingerprint(same)
    assert fingerprint(base).sha256 != fingerprint(ImageSet(edited, base.labels, ["a", "b"])).sha256
    assert fingerprint(base).sha256 != fingerprint(ImageSet(images, base.labels, ["a", "c"])).sha256
    assert fingerprint(base).counts == [2, 2]


def test_resume_accepts_the_same_source(trained: dict[str, Path]) -> None:
    seq = api.SequenceOptions(source=str(trained["data"] / "train"), test=str(trained["data"] / "test"), image_size=16,
                              tasks=1)
    assert api.train(seq, RUN, trained["learner"], resume=True).state.steps == 1  # nothing left to learn, no refusal


def test_evaluate_says_which_test_images_it_used(trained: dict[str, Path], moved: dict[str, Path]) -> None:
    here = api.evaluate(trained["learner"], device="cpu")
    assert here.test_data.used == "folder" and str(trained["data"] / "test") in here.test_data.tasks[0].detail
    gone = api.evaluate(moved["learner"], device="cpu", data_roots=[])
    # the original folder is still where it was: the copy finds it by its fingerprint
    assert gone.test_data.used == "folder"
    remapped = api.evaluate(moved["learner"], device="cpu", data_roots=[moved["data"]])
    assert remapped.test_data.tasks[0].detail == f"the test set at {moved['data'] / 'test'}"
    assert remapped.metrics.overall == here.metrics.overall and remapped.test_images == 16


def test_carried_sample_stands_in_for_a_moved_or_changed_folder(trained, moved, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SBCLI_CACHE", str(tmp_path / "other-machine"))  # nothing remembered here
    result = api.evaluate(moved["learner"], device="cpu")
    task = result.test_data.tasks[0]
    assert task.used == "sample" and task.images == 16 and "was not found here" in task.detail
    some_image = sorted((moved["data"] / "test" / "red").iterdir())[0]
    shutil.copyfile(sorted((moved["data"] / "test" / "green").iterdir())[0], some_image)  # same classes, other pixels
    changed = api.evaluate(moved["learner"], device="cpu", data_roots=[moved["data"]])
    assert changed.test_data.used == "sample" and "changed since it was learned" in changed.test_data.tasks[0].detail
    res = CliRunner().invoke(app, ["evaluate", str(moved["learner"])], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "Test images of task 1: 16 from the carried test sample" in res.stderr
    res = CliRunner().invoke(app, ["evaluate", str(moved["learner"]), "--json"])
    assert json.loads(res.stdout)["test_data"]["used"] == "sample"


def test_a_data_root_with_other_classes_is_refused(moved: dict[str, Path], color_data, tmp_path: Path) -> None:
    before = snapshot(moved["learner"])
    other = color_data["task2_train"].parent  # blue and yellow, in train/ and test/
    for command in (["evaluate", str(moved["learner"])],
                    ["add-task", str(moved["learner"]), str(color_data["task2_train"]), "--epochs", "1"]):
        res = CliRunner().invoke(app, [*command, "--data-root", str(other), "--device", "cpu"], env={"COLUMNS": "300"})
        assert res.exit_code == 1 and "Traceback" not in res.output
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and f"--data-root {other} holds other classes (blue, yellow)" in errors[0], res.stderr
        assert res.stderr.strip().endswith(errors[0])
    with pytest.raises(DataError, match="holds none of the learner's test sets"):
        api.evaluate(moved["learner"], device="cpu", data_roots=[tmp_path / "empty-dir"])
    assert snapshot(moved["learner"]) == before


@pytest.mark.parametrize("tamper", ["labels", "counts"])
def test_a_sample_that_does_not_match_the_classes_is_refused(moved: dict[str, Path], tamper: str) -> None:
    path = moved["learner"] / json.loads((moved["learner"] / "learner.json").read_text())["files"]["test_sample"]
    tensors = load_file(str(path))
    if tamper == "labels":
        tensors["labels"][0] = 7  # a class the learner does not know
    else:
        tensors["labels"][0] = 1 - tensors["labels"][0]  # another learner's counts
    save_file(tensors, str(path))
    rehash(moved["learner"])  # recorded as a crafted learner would: the sample's own check answers
    before = snapshot(moved["learner"])
    res = CliRunner().invoke(app, ["evaluate", str(moved["learner"]), "--device", "cpu"], env={"COLUMNS": "300"})
    assert res.exit_code == 1 and "does not match" in res.stderr and res.stderr.strip().count("\n") == 0
    assert snapshot(moved["learner"]) == before


def test_no_test_sample_keeps_private_images_out(color_data, tmp_path: Path, monkeypatch) -> None:
    learner = train(color_data["task1_train"].parent, tmp_path / "private", test_sample=False)
    state = read_state(learner)
    assert state.test_sample.counts == [0, 0] and state.test_sample.declined_tasks == [1]
    monkeypatch.setenv("SBCLI_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(DataError, match="no test images to evaluate on"):
        api.evaluate(learner, device="cpu")
    step = api.add_task(learner, color_data["task2_train"], color_data["task2_test"], device="cpu",
                        options=api.AddTaskOptions(epochs=1, test_sample=False))
    assert Learner.load(learner).test_sample.counts(4) == [0, 0, 0, 0]
    assert "kept them out of the learner (--no-test-sample)" in step.notes[0]


def test_card_round_trips_and_names_only_pushed_branches(trained: dict[str, Path], tmp_path: Path) -> None:
    state = read_state(trained["learner"])
    facts = CardFacts("tester/colours", "wa", 0, 16, ["learner.json"], ["step-1"], "apache-2.0")
    (tmp_path / "README.md").write_text(model_card(state, facts))
    card = hf.ModelCard.load(tmp_path / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "sbcli" and data["license"] == "apache-2.0" and data["metrics"] == ["accuracy"]
    assert data["tags"][:2] == ["class-incremental", "continual-learning"] and "image-classification" in data["tags"]
    name, results = model_index_to_eval_results(data["model-index"])
    assert name == "colours" and results == eval_results(state) == card.data.eval_results
    assert [r.metric_value for r in results][0] == round(state.history[0].metrics.overall, 4)
    assert "Training images inside: no." in card.text and "Test images inside: yes." in card.text
    assert "step-2" in card.text and "step-0" not in card.text  # the next step, in the how-to; no other branch
    benchmark = public_state(state)
    benchmark.tasks = [dataclasses.replace(benchmark.tasks[0], source={"kind": "cifar100", "name": "cifar100"})]
    assert hf.ModelCard(model_card(benchmark, facts)).data.datasets == ["uoft-cs/cifar100"]


def test_a_format_1_learner_is_pushed_without_its_paths(trained: dict[str, Path], tmp_path: Path) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(trained["learner"], legacy)
    state = json.loads((legacy / "learner.json").read_text())
    spec = {"kind": "folder", "path": str(trained["data"] / "train"), "image_size": 16, "test": str(trained["data"] / "test")}
    state["tasks"][0]["source"] = state["plan"]["source"] = spec
    state.pop("test_sample")
    for files in (state["files"], *state["kept_steps"].values()):
        files.pop("test_sample")
    state.pop("hashes")  # a learner of before the file hashes
    state["format_version"] = 2
    (legacy / "learner.json").write_text(json.dumps(state))
    assert api.evaluate(legacy, device="cpu").test_data.used == "folder"  # its own path, still here
    public = public_state(read_state(legacy))
    assert str(trained["data"]) not in json.dumps([t.to_json() for t in public.tasks]) + json.dumps(public.plan.to_json())
    assert public.tasks[0].source == {"kind": "folder", "name": "train", "dataset": trained["data"].name,  # photos/train: photos
                                         "image_size": 16, "test": {"name": "test"}}


def test_the_card_snippet_classifies_an_image_file(trained: dict[str, Path], tmp_path: Path) -> None:
    """The usage snippet of the card, run as written (onnxruntime, numpy, Pillow), agrees with `sb predict`."""
    from sbcli.export.onnx import ort_session

    onnx_path = tmp_path / "model.onnx"
    api.export_onnx(trained["learner"], onnx_path)
    meta = ort_session(onnx_path).get_modelmeta()
    if "preprocess" not in meta.custom_metadata_map:
        pytest.skip("this ONNX export has no 'preprocess' metadata key yet (it comes with the serve branch)")
    card = model_card(read_state(trained["learner"]), CardFacts("tester/colours", "wa", 0, 16, []))
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    image = tmp_path / "photo.png"  # larger than the training size, so the snippet resizes as sbcli does
    rgb = np.clip(np.array([200, 40, 40]) + np.random.default_rng(0).normal(0, 25, (30, 40, 3)), 0, 255)
    Image.fromarray(rgb.astype(np.uint8)).save(image)
    code = snippet.replace('"model.onnx"', repr(str(onnx_path))).replace('"photo.jpg"', repr(str(image)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == api.predict(onnx_path, [image], top_k=1, device="cpu")[0].labels[0]


def test_record_checks_refuse_paths_and_bad_fingerprints(trained: dict[str, Path]) -> None:
    from sbcli.data.source_records import record_problem

    record = json.loads((trained["learner"] / "learner.json").read_text())["tasks"][0]["source"]
    assert record_problem(record) is None
    assert "not a path" in record_problem({**record, "name": "/home/alice/photos"})
    assert "name" in record_problem({**record, "test": {**record["test"], "name": ".."}})
    assert ".counts" in record_problem({**record, "train": {**record["train"], "counts": [1]}})
    assert ".sha256" in record_problem({**record, "test": {**record["test"], "sha256": "x" * 64}})
    assert "not a known field" in record_problem({**record, "path": "/data"})


def test_onnx_check_uses_the_carried_sample_where_the_memory_lacks_classes(trained, tmp_path: Path) -> None:
    from sbcli.methods.memory import ExemplarMemory

    learner = Learner.load(trained["learner"])
    learner.memory = ExemplarMemory(**dataclasses.asdict(learner.state.memory))  # as pulled from a push without --with-memory
    learner.save(tmp_path / "no-memory")
    report = api.export_onnx(tmp_path / "no-memory", tmp_path / "model.onnx")
    assert report.parity.source == "images from the carried test sample" and report.parity.images == 16
    assert report.parity.argmax_agreement == 1.0
