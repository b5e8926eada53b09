"""Zoo entries built on the user's machine (``location = "build:PACKAGE"``): `sb pull NAME --data FILE` learns
the entry by its recipe from the weight package's backbone and a copy of its data, offline, checked by the
SHA-256 of the images it learns from; then `sb add-task` grows it, and it travels through the Hub like any learner.

The learning tests use a small index of their own (a few CIFAR-10 images at 64 px, two tasks); the shipped
index's built entries are checked against the real archives where they are present.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
import zipfile
from pathlib import Path

import pytest
import torch
from realdata import archive_path
from test_weight_packages import needs_lite0, weights_cache  # noqa: F401  (its converted weights in a cache of its own)
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.data.subset import SubsetSpec, write_subset
from sbcli.errors import ConfigError, DataError
from sbcli.hub.weight_packages import PACKAGES
from sbcli.hub.zoo import load_index

CLASSES = ["frog", "airplane", "horse", "automobile"]  # the entry's class order
PER_CLASS, TEST_PER_CLASS = 6, 3
pytestmark = pytest.mark.usefixtures("one_thread")


needs_package = needs_lite0  # the weight package's own tests' mark: skipped where it is not installed


def _zip_of(train: Path, test: Path, archive: Path, top: str = "mydata") -> Path:
    with zipfile.ZipFile(archive, "w") as z:
        for split, folder in (("train", train), ("test", test)):
            for file in sorted(folder.rglob("*")):
                if file.is_file():
                    z.write(file, f"{top}/{split}/{file.relative_to(folder).as_posix()}")
    return archive


@pytest.fixture(scope="module")
def data_zip(cifar10_subset, tmp_path_factory) -> Path:
    train, test = cifar10_subset(CLASSES, PER_CLASS + 2, TEST_PER_CLASS + 1)  # more than the entry takes
    return _zip_of(train, test, tmp_path_factory.mktemp("data") / "cifar4.zip")


def _index(folder: Path, digest: str, **overrides) -> Path:
    """An index with one built entry (its recipe: the shipped one at 64 px) in ``folder``."""
    (folder / "recipes").mkdir(parents=True, exist_ok=True)
    recipe = (Path(__file__).resolve().parents[1] / "zoo" / "recipes" / "efficientnet-lite0-ridge.toml").read_text()
    recipe = re.sub(r"(?m)^projection = \d+$", "projection = 256", recipe)  # small sums: a small learner to push
    assert "projection = 256" in recipe
    (folder / "recipes" / "lite0-64.toml").write_text(recipe + "image_size = 64\n")
    entry = {"description": "four CIFAR-10 classes in two tasks", "dataset": "CIFAR-10; four classes",
             "class_order": json.dumps(CLASSES), "tasks": "[2, 2]", "method": '"ranpac"', "inference": '"ridge"',
             "network": '"timm/tf_efficientnet_lite0"', "image_size": "64", "recipe": '"lite0-64"',
             "location": '"build:efficientnet-lite0"', "build": '"sb pull c10-four --data cifar4.zip"',
             "licence": '"CIFAR-10: no formal licence; cite Krizhevsky 2009"'}
    entry["description"] = json.dumps(entry["description"])
    entry["dataset"] = json.dumps(entry["dataset"])
    entry.update(overrides)
    lines = ["format = 1", "[entries.c10-four]", *(f"{k} = {v}" for k, v in entry.items()),
             "[entries.c10-four.data]", '"file" = "cifar4.zip"', f'"sha256" = "{digest}"',
             f'"per_class" = {PER_CLASS}', f'"test_per_class" = {TEST_PER_CLASS}',
             "[entries.c10-four.files]", f'"learner.json" = "{"0" * 64}"',
             "[entries.c10-four.metrics]", "last = 90.0", "build_seconds = 5.0"]
    (folder / "index.toml").write_text("\n".join(lines) + "\n")
    return folder / "index.toml"


@pytest.fixture(scope="module")
def index(data_zip, tmp_path_factory) -> Path:
    digest = write_subset(data_zip, SubsetSpec(sorted(CLASSES), PER_CLASS, TEST_PER_CLASS),
                          tmp_path_factory.mktemp("subset")).sha256
    return _index(tmp_path_factory.mktemp("zoo"), digest)


@pytest.fixture(scope="module")
def built(index, data_zip, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "mine"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        res = CliRunner().invoke(app, ["pull", "c10-four", "--index", str(index), "--data", str(data_zip),
                                       "-o", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    return out


@needs_package
def test_pull_builds_the_entry_offline_in_its_class_order_and_add_task_grows_it(built, cifar10_subset, tmp_path):
    state = json.loads((built / "learner.json").read_text())
    assert state["class_names"] == CLASSES and [len(t["classes"]) for t in state["tasks"]] == [2, 2]
    assert state["provenance"]["pretrained"]["package"] == PACKAGES["efficientnet-lite0"].distribution
    accuracy = [h["metrics"]["overall"] for h in state["history"]]
    assert len(accuracy) == 2 and accuracy[-1] >= 50.0, accuracy  # chance is 25 % over four classes
    mine = tmp_path / "mine"
    shutil.copytree(built, mine)
    train, val = cifar10_subset(["ship", "truck"], 4, 3)
    res = CliRunner().invoke(app, ["add-task", str(mine), str(train), "--test", str(val), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    after = json.loads((mine / "learner.json").read_text())
    assert after["class_names"] == [*CLASSES, "ship", "truck"] and len(after["history"]) == 3


@needs_package
def test_a_built_learner_pushes_and_pulls_through_the_hub(built, fake_hub, tmp_path):
    from sbcli.learner.state import Learner

    api.push(built, "tester/c10-four")
    pulled = api.pull("tester/c10-four", tmp_path / "pulled").path
    a, b = Learner.load(built), Learner.load(pulled)
    assert a.state.class_names == b.state.class_names and a.state.history[-1].metrics == b.state.history[-1].metrics
    for key, tensor in a.model.state_dict().items():
        assert torch.equal(tensor, b.model.state_dict()[key]), key


def _refused(args: list[str], says: str, target: Path) -> None:
    res = CliRunner().invoke(app, args)
    assert res.exit_code != 0 and says in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and not target.exists()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}")]  # no half-made folder


def test_a_built_entry_without_data_says_to_give_it(index, tmp_path):
    _refused(["pull", "c10-four", "--index", str(index), "-o", str(tmp_path / "x")],
             "is built on this machine, offline, from the efficientnet-lite0 weight package", tmp_path / "x")


def test_other_images_are_refused_before_any_training(data_zip, index, tmp_path):
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(data_zip) as src, zipfile.ZipFile(other, "w") as dst:
        names = sorted(n for n in src.namelist() if "/train/frog/" in n)
        for n in src.namelist():
            data = src.read(n)
            dst.writestr(n, data[:-1] + bytes([data[-1] ^ 1]) if n == names[0] else data)  # one bit of one image
    _refused(["pull", "c10-four", "--index", str(index), "--data", str(other), "-o", str(tmp_path / "x")],
             "differ from the ones it was built from", tmp_path / "x")


def test_a_copy_without_a_class_or_enough_images_is_refused(data_zip, index, tmp_path):
    short = tmp_path / "short.zip"
    with zipfile.ZipFile(data_zip) as src, zipfile.ZipFile(short, "w") as dst:
        for n in src.namelist():
            if "/test/horse/" not in n:
                dst.writestr(n, src.read(n))
    _refused(["pull", "c10-four", "--index", str(index), "--data", str(short), "-o", str(tmp_path / "x")],
             "holds 0 test images of class 'horse' where 3 are needed", tmp_path / "x")
    _refused(["pull", "c10-four", "--index", str(index), "--data", str(tmp_path / "none.zip"), "-o", str(tmp_path / "x")],
             "none.zip does not exist", tmp_path / "x")


def test_data_for_an_entry_that_is_not_built_and_a_revision_of_one_are_refused(index, data_zip, tmp_path):
    _refused(["pull", "demo-sb-tiny", "--data", str(data_zip), "-o", str(tmp_path / "x")],
             "--data is for a zoo entry that is built on this machine", tmp_path / "x")
    _refused(["pull", "c10-four@v1", "--index", str(index), "--data", str(data_zip), "-o", str(tmp_path / "x")],
             "has no revisions; drop '@v1'", tmp_path / "x")


@pytest.mark.parametrize(("override", "says"), [
    ({"licence": '""'}, "states no licence"),
    ({"location": '"build:efficientnet-lite9"'}, "use build:efficientnet-lite0"),
    ({"class_order": '["frog", "../airplane", "horse", "automobile"]'}, "plain folder names"),
])
def test_the_index_refuses_an_inconsistent_built_entry(tmp_path, override, says):
    with pytest.raises(ConfigError, match=says):
        load_index(_index(tmp_path, "a" * 64, **override))


def test_the_subset_is_the_same_from_a_zip_and_from_its_folder(data_zip, tmp_path):
    spec = SubsetSpec(sorted(CLASSES), PER_CLASS, TEST_PER_CLASS)
    with zipfile.ZipFile(data_zip) as z:
        z.extractall(tmp_path / "unzipped")
    a = write_subset(data_zip, spec, tmp_path / "a")
    b = write_subset(tmp_path / "unzipped" / "mydata", spec, tmp_path / "b")
    assert a.sha256 == b.sha256 and a.images == b.images == 4 * (PER_CLASS + TEST_PER_CLASS)
    with pytest.raises(DataError, match="not a readable zip file"):
        write_subset(tmp_path / "unzipped" / "mydata" / "train" / "frog" / sorted(
            (tmp_path / "unzipped" / "mydata" / "train" / "frog").iterdir())[0].name, spec, tmp_path / "c")


@pytest.mark.parametrize("name", [n for n, e in load_index().entries.items() if e.kind == "build"])
def test_the_shipped_built_entries_name_the_images_of_their_archive(name, tmp_path):
    entry = load_index().get(name)
    archive = archive_path(entry.data["file"])
    if not archive.is_file():
        pytest.skip(f"real data absent: {archive} (set SBCLI_TEST_DATA to the folder holding it)")
    subset = write_subset(archive, SubsetSpec(sorted(entry.class_order), entry.data["per_class"],
                                              entry.data["test_per_class"]), tmp_path)
    assert subset.sha256 == entry.data["sha256"]
    assert entry.licence and entry.metrics["last"] == entry.metrics["accuracy_per_step"][-1]
    assert len(entry.metrics["accuracy_per_step"]) == len(entry.tasks)
    recipe = tomllib.loads(load_index().recipe_path(entry).read_text())
    assert recipe["pretrained"] == entry.target
