"""A learner with no classes yet: a zoo backbone entry pulled from the (local, fake) Hub, pinned and verified, then
grown by `sb add-task` from its first task; the same learner `sb train --recipe` makes; what it refuses."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from fake_hub import FakeHub
from safetensors.torch import save
from test_pretrained import WIDTH, publish, timm_checkpoint
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.errors import ConfigError, LearnerError
from sbcli.hub.zoo import load_index, sha256_file
from sbcli.learner.state import Learner, kept_steps
from sbcli.methods.ranpac import GRAM

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = "timm-like/resnet18-tiny"
SHIPPED = [e for e in load_index().entries.values() if e.holds == "backbone"]

ENTRY = """format = 1
[entries.tiny-ridge]
description = "d"
dataset = "none yet"
class_order = []
tasks = []
method = "ranpac"
inference = "ridge"
network = "resnet18-in"
image_size = 32
recipe = "tiny-ridge"
location = "hub:{repo}"
revision = "{commit}"
holds = "backbone"
build = "sb train FOLDER --recipe tiny-ridge"
[entries.tiny-ridge.files]
"model.safetensors" = "{sha}"
"""

RECIPE = """method = "ranpac"
arch = "resnet18-in"
width = {width}
image_size = 32
pretrained = "{repo}@{commit}"
pretrained_sha256 = "{sha}"
projection = 256
memory = 0
seed = 0
"""


@pytest.fixture
def zoo(fake_hub: FakeHub, tmp_path: Path) -> dict:
    """A backbone on the Hub and a zoo index with an entry pinned to its commit and SHA-256."""
    import huggingface_hub as hf

    data = save(timm_checkpoint())
    commit = publish(hf.HfApi(), REPO, {"model.safetensors": data})
    folder = tmp_path / "zoo"
    (folder / "recipes").mkdir(parents=True)
    sha = sha256_file(_write(tmp_path / "weights.safetensors", data))
    (folder / "index.toml").write_text(ENTRY.format(repo=REPO, commit=commit, sha=sha))
    (folder / "recipes" / "tiny-ridge.toml").write_text(RECIPE.format(width=WIDTH, repo=REPO, commit=commit, sha=sha))
    return {"index": folder / "index.toml", "commit": commit, "sha": sha, "recipe": folder / "recipes" / "tiny-ridge.toml"}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture
def colours(tmp_path: Path) -> dict[str, Path]:
    from conftest import write_class_folder

    out = {}
    for task, classes in (("t1", ["red", "green"]), ("t2", ["blue", "yellow"])):
        out[task] = write_class_folder(tmp_path / task / "train", classes, 12, size=32, seed=1)
        out[f"{task}_test"] = write_class_folder(tmp_path / task / "test", classes, 6, size=32, seed=2)
    return out


def test_a_backbone_entry_pulls_into_a_learner_with_no_classes_that_add_task_grows(zoo, colours, tmp_path):
    out = tmp_path / "mine"
    report = api.pull("tiny-ridge", out, index=zoo["index"])
    assert report.contents["classes"] == 0 and report.contents["steps"] == 0
    assert report.verified == ["model.safetensors"] and report.commit == zoo["commit"] and not report.from_cache
    state = json.loads((out / "learner.json").read_text())
    assert state["class_names"] == [] and state["history"] == [] and state["method"] == "ranpac"
    record = state["provenance"]["pretrained"]
    assert record["sha256"] == zoo["sha"] and record["revision"] == zoo["commit"] and "from_cache" not in record
    assert state["normalization"]["mean"] == pytest.approx([0.485, 0.456, 0.406])  # the weights' statistics
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no pull folder left

    first = api.add_task(out, colours["t1"], colours["t1_test"], device="cpu")
    assert first.step == 1 and first.num_classes == 2 and first.metrics.overall > 75
    second = api.add_task(out, colours["t2"], colours["t2_test"], device="cpu")
    assert second.num_classes == 4 and second.metrics.overall > 60
    learner = Learner.load(out)
    assert learner.state.class_names == ["green", "red", "blue", "yellow"] and kept_steps(out) == [0, 1, 2]
    weights = timm_checkpoint()  # the backbone is exactly the pinned weights, two tasks later
    torch.testing.assert_close(learner.model.stages[3][1].conv2.weight, weights["layer4.1.conv2.weight"], rtol=0, atol=0)


def test_pull_then_add_task_is_the_learner_sb_train_makes_from_the_recipe(zoo, colours, tmp_path):
    api.pull("tiny-ridge", tmp_path / "pulled", index=zoo["index"])
    pulled = api.add_task(tmp_path / "pulled", colours["t1"], colours["t1_test"], device="cpu")
    result = CliRunner().invoke(app, ["train", str(colours["t1"]), "--test", str(colours["t1_test"]), "--tasks", "1", "--order-seed", "-1",
                                      "--recipe", str(zoo["recipe"]), "--device", "cpu", "--out", str(tmp_path / "trained")])
    assert result.exit_code == 0, result.output
    a, b = Learner.load(tmp_path / "pulled"), Learner.load(tmp_path / "trained")
    assert a.state.class_names == b.state.class_names and a.state.method_config == b.state.method_config
    assert a.state.train_config == b.state.train_config and a.state.image_size == b.state.image_size
    for key in b.extra:  # projection, G, Q, the head: the same numbers
        torch.testing.assert_close(a.extra[key], b.extra[key], rtol=0, atol=0)
    assert pulled.metrics.overall == b.state.history[0].metrics.overall


def test_a_learner_with_no_classes_refuses_what_needs_classes_in_one_sentence(zoo, tmp_path):
    out = tmp_path / "mine"
    api.pull("tiny-ridge", out, index=zoo["index"])
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    from conftest import write_class_folder

    images = write_class_folder(tmp_path / "photos", ["red"], 1, size=32)
    runner = CliRunner()
    for args in (["evaluate", str(out)], ["export", str(out), "--format", "onnx", "-o", str(tmp_path / "m.onnx")],
                 ["predict", str(out), str(images)]):
        result = runner.invoke(app, args)
        assert result.exit_code != 0 and "has no classes yet" in result.output, (args, result.output)
        assert "Traceback" not in result.output and "sb add-task" in result.output
    two = write_class_folder(tmp_path / "two", ["red", "green"], 2, size=32)
    result = runner.invoke(app, ["train", str(two), "--out", str(out), "--resume"])
    assert result.exit_code != 0 and "no task sequence to resume" in " ".join(result.output.split()), result.output
    with pytest.raises(LearnerError, match="no classes yet"):
        api.evaluate(out, device="cpu")
    with pytest.raises(LearnerError, match="nothing to push"):
        api.push(out, "me/empty")
    import huggingface_hub as hf

    assert not hf.HfApi().repo_exists("me/empty")  # refused before the repository was created
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "m.onnx").exists()


def test_the_pinned_hash_and_revision_are_enforced_and_a_refused_pull_leaves_nothing(zoo, tmp_path):
    index = zoo["index"]
    index.write_text(index.read_text().replace(zoo["sha"], "0" * 64))
    with pytest.raises(ConfigError, match="SHA-256"):
        api.pull("tiny-ridge", tmp_path / "bad", index=index)
    assert not (tmp_path / "bad").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]
    with pytest.raises(ConfigError, match="pinned to revision"):
        api.pull("tiny-ridge@main", tmp_path / "other", index=index)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    with pytest.raises(LearnerError):
        api.pull("tiny-ridge", tmp_path / "full", index=index)
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep"


def test_a_pulled_backbone_comes_from_the_cache_when_the_hub_does_not_answer(zoo, fake_hub: FakeHub, tmp_path):
    api.pull("tiny-ridge", tmp_path / "a", index=zoo["index"])
    fake_hub.stop()
    report = api.pull("tiny-ridge", tmp_path / "b", index=zoo["index"])
    assert report.from_cache and report.contents["classes"] == 0
    result = CliRunner().invoke(app, ["pull", "tiny-ridge", "--index", str(zoo["index"]), "-o", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "from the local cache" in result.output and f"sb add-task {tmp_path / 'c'} FOLDER" in result.output
    assert "sb evaluate" not in result.output  # nothing to evaluate yet


def test_rollback_to_step_0_gives_back_the_learner_with_no_classes(zoo, colours, tmp_path):
    from test_json_schemas import check

    out = tmp_path / "mine"
    pulled = CliRunner().invoke(app, ["pull", "tiny-ridge", "--index", str(zoo["index"]), "-o", str(out), "--json"])
    assert check("pull", pulled.stdout)["contents"]["classes"] == 0
    api.add_task(out, colours["t1"], colours["t1_test"], device="cpu")
    rolled = CliRunner().invoke(app, ["rollback", str(out), "0", "--json"])
    assert check("rollback", rolled.stdout)["classes"] == 0  # the documented --json, at step 0
    learner = Learner.load(out)
    assert learner.state.num_classes == 0 and learner.model.num_classes == 0 and GRAM not in learner.extra
    again = api.add_task(out, colours["t2"], colours["t2_test"], device="cpu")  # another first task
    assert again.step == 1 and Learner.load(out).state.class_names == ["blue", "yellow"]
    assert kept_steps(out) == [0, 1]
    pytest.importorskip("onnxruntime")
    assert api.export_triton(out, tmp_path / "repo").versions == (1,)  # step 0 has no classes: no version
    from sbcli.export.serving import kept_steps as served_steps

    assert list(served_steps(out)) == [1]  # nor a version that `sb serve LEARNER` offers


def test_the_zoo_lists_what_each_entry_holds():
    from test_json_schemas import check

    listed = check("pull-list", CliRunner().invoke(app, ["pull", "--list", "--json"]).stdout)
    assert {e["name"] for e in listed if e["holds"] == "backbone"} == {e.name for e in SHIPPED} != set()


@pytest.mark.parametrize("entry", [e for e in SHIPPED if e.kind == "hub"], ids=lambda e: e.name)
def test_shipped_backbone_entries_agree_with_their_recipes_and_timm(entry):
    recipe = tomllib.loads(load_index().recipe_path(entry).read_text())
    assert recipe["method"] == entry.method and recipe["arch"] == entry.network
    assert recipe["pretrained"] == f"{entry.target}@{entry.revision}" and len(entry.revision) == 40
    assert recipe["pretrained_sha256"] == entry.files["model.safetensors"]
    assert entry.class_order == [] and entry.tasks == [] and entry.network == entry.location.removeprefix("hub:")
    pytest.importorskip("timm")
    from sbcli.nets.timm_backbone import input_config

    assert input_config(entry.network).image_size == entry.image_size  # timm's own configuration, offline


@pytest.mark.parametrize("entry", [e for e in SHIPPED if e.kind == "package"], ids=lambda e: e.name)
def test_shipped_package_backbone_entries_agree_with_their_recipes_and_the_pinned_weights(entry):
    from sbcli.hub.weight_packages import PACKAGES

    pkg = PACKAGES[entry.target]
    recipe = tomllib.loads(load_index().recipe_path(entry).read_text())
    assert recipe["method"] == entry.method and recipe["arch"] == entry.network == pkg.arch
    assert recipe["pretrained"] == pkg.name and recipe["pretrained_sha256"] == pkg.sha256 == entry.files[Path(pkg.file).name]
    assert entry.image_size == pkg.input_size and entry.revision is None and entry.tasks == []


def test_a_timm_backbone_entry_takes_timms_resolution_and_statistics(fake_hub: FakeHub, colours, tmp_path):
    """The path the shipped entries take: --arch timm/NAME, weights in timm's own names, 224 px from timm's configuration."""
    timm = pytest.importorskip("timm")
    import huggingface_hub as hf

    repo = "timm/resnet18.a1_in1k"
    torch.manual_seed(0)
    data = save({k: v.contiguous() for k, v in timm.create_model("resnet18", pretrained=False).state_dict().items()})
    commit = publish(hf.HfApi(), repo, {"model.safetensors": data})
    sha = sha256_file(_write(tmp_path / "w.safetensors", data))
    folder = tmp_path / "zoo"
    (folder / "recipes").mkdir(parents=True)
    entry = ENTRY.format(repo=repo, commit=commit, sha=sha).replace('"resnet18-in"', f'"{repo}"').replace("= 32", "= 224")
    (folder / "index.toml").write_text(entry)
    recipe = RECIPE.format(width=1.0, repo=repo, commit=commit, sha=sha).replace('"resnet18-in"', f'"{repo}"')
    (folder / "recipes" / "tiny-ridge.toml").write_text(recipe.replace("image_size = 32\n", ""))
    api.pull("tiny-ridge", tmp_path / "mine", index=folder / "index.toml")
    state = api.learner_state(tmp_path / "mine")
    mean = timm.create_model("resnet18.a1_in1k", pretrained=False).pretrained_cfg["mean"]
    assert state.arch == repo and state.image_size == 224 and state.normalization["mean"] == pytest.approx(mean)
    step = api.add_task(tmp_path / "mine", colours["t1"], colours["t1_test"], device="cpu")
    assert step.num_classes == 2 and api.learner_state(tmp_path / "mine").image_size == 224
