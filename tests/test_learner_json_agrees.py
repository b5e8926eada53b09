"""learner.json, the one file no hash covers, must agree with the current step's hashed state.json:
at every load and at every pull, whatever the learner's origin."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub as hf
import pytest
from fake_hub import FakeHub
from test_learner import tree

from sbcli import api
from sbcli.errors import LearnerError
from sbcli.learner.state import Learner, read_state


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


EDITS = {
    "class_names": lambda s: s["class_names"].reverse(),  # labels silently swapped in `sb predict`
    "normalization": lambda s: s["normalization"]["std"].__setitem__(0, 0.5),
    "history": lambda s: s["history"][-1]["metrics"].__setitem__("overall", 99.0),
}


@pytest.fixture
def learner(one_task_learner, tmp_path) -> Path:
    target = tmp_path / "L"
    shutil.copytree(one_task_learner, target)
    return target


@pytest.mark.parametrize("field", sorted(EDITS))
def test_a_valid_json_edit_of_learner_json_is_refused_at_load(learner, field):
    edit_json(learner / "learner.json", EDITS[field])
    before = tree(learner)
    for read in (lambda: Learner.load(learner), lambda: read_state(learner)):
        with pytest.raises(LearnerError, match=rf"disagrees with the step's hashed record steps/\d+/state.json on {field}"):
            read()
    assert tree(learner) == before


def test_an_unedited_learner_and_its_published_copy_agree(learner, tmp_path):
    Learner.load(learner)
    Learner.load(learner).publish(tmp_path / "flat")
    assert (tmp_path / "flat" / "state.json").is_file()  # the published step carries its hashed record too
    assert Learner.load(tmp_path / "flat").state.class_names == Learner.load(learner).state.class_names
    edit_json(tmp_path / "flat" / "learner.json", EDITS["class_names"])
    with pytest.raises(LearnerError, match="disagrees"):
        Learner.load(tmp_path / "flat")


def upload(folder: Path, repo: str) -> None:
    hf.HfApi().create_repo(repo)
    hf.HfApi().upload_folder(folder_path=str(folder), repo_id=repo)


def test_a_pull_outside_the_zoo_verifies_the_current_steps_state(fake_hub: FakeHub, learner, tmp_path):
    """A learner in the steps layout (not a push): its current state.json is read and checked at pull."""
    state_rel = json.loads((learner / "learner.json").read_text())["files"]["state"]
    edit_json(learner / state_rel, EDITS["class_names"])  # damaged: its hash no longer matches
    upload(learner, "tester/damaged-state")
    with pytest.raises(LearnerError, match="not an sbcli learner"):
        api.pull("tester/damaged-state", tmp_path / "got")
    assert not (tmp_path / "got").exists()


def test_a_pull_of_an_edited_learner_json_is_refused(fake_hub: FakeHub, learner, tmp_path):
    Learner.load(learner).publish(tmp_path / "flat")
    edit_json(tmp_path / "flat" / "learner.json", EDITS["normalization"])
    upload(tmp_path / "flat", "tester/edited")
    with pytest.raises(LearnerError, match="disagrees with the step's hashed record state.json on normalization"):
        api.pull("tester/edited", tmp_path / "got")
    assert not (tmp_path / "got").exists()
