"""Hub push and pull with the real huggingface_hub client against the loopback FakeHub.

One module fixture trains a tiny learner and pushes three times to its own FakeHub: step 1
(without memory), step 2 (without memory), step 2 again with --with-memory. Each test then gets a
fresh ``fake_hub`` (the conftest fixture: environment, cache and no internet) holding a copy of
those repositories, so the ONNX exports behind a push run once per module.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub as hf
import pytest
from conftest_hub import point_hub_client_at
from fake_hub import FakeHub, dead_endpoint
from safetensors.torch import load_file
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError, ExportError, LearnerError
from sbcli.hub.client import safe_relpath
from sbcli.hub.zoo import sha256_file
from sbcli.learner.state import Learner

REPO = "tester/colours"
LEARNER_FILES = ["README.md", "learner.json", "memory.safetensors", "model.onnx", "model.safetensors", "state.json",
                 "test-sample.safetensors"]


def train_step1(color_data: dict[str, Path], out: Path) -> Path:
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), image_size=16, tasks=1)
    api.train(seq, run, out)
    return out


@pytest.fixture(scope="module")
def published(color_data, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("published")
    learner = train_step1(color_data, root / "learner")
    shutil.copytree(learner, root / "step1")
    with pytest.MonkeyPatch.context() as mp, FakeHub() as hub:
        point_hub_client_at(mp, hub.endpoint, root / "hf_home")
        reports = [api.push(learner, REPO)]
        api.add_task(learner, color_data["task2_train"], color_data["task2_test"], device="cpu")
        reports.append(api.push(learner, REPO))
        reports.append(api.push(learner, REPO, with_memory=True))
    return {"repos": hub.repos, "step1": root / "step1", "step2": learner, "reports": reports}


@pytest.fixture
def hub(fake_hub: FakeHub, published: dict) -> FakeHub:
    fake_hub.repos = copy.deepcopy(published["repos"])
    return fake_hub


def download(name: str, revision: str) -> Path:
    return Path(hf.hf_hub_download(REPO, name, revision=revision))


def test_every_step_is_a_branch_and_main_is_the_latest(hub: FakeHub, published: dict) -> None:
    first, second, with_memory = published["reports"]
    assert list(first.revisions) == ["main", "step-1"] and list(second.revisions) == ["main", "step-2"]
    assert first.revisions["main"] == first.revisions["step-1"]  # a new step's branch starts at main's commit
    api_ = hf.HfApi()
    refs = {b.name: b.target_commit for b in api_.list_repo_refs(REPO).branches}
    assert refs == {"main": with_memory.revisions["main"], "step-1": first.revisions["step-1"],
                    "step-2": with_memory.revisions["step-2"]}
    assert api_.list_repo_files(REPO, revision="step-2") == [".gitattributes", *LEARNER_FILES]
    assert first.files == LEARNER_FILES
    for revision, classes in (("step-1", 2), ("step-2", 4), ("main", 4)):
        assert len(json.loads(download("learner.json", revision).read_text())["class_names"]) == classes
    titles = [c.title for c in api_.list_repo_commits(REPO, revision="step-2")]
    assert titles.count("sbcli: learner after step 2") == 2  # the re-push with memory updated the step-2 branch


def test_memory_goes_up_only_when_asked(hub: FakeHub, published: dict) -> None:
    assert len(load_file(str(download("memory.safetensors", "step-1")))["labels"]) == 0
    local_files = json.loads((published["step2"] / "learner.json").read_text())["files"]
    local = load_file(str(published["step2"] / local_files["memory"]))
    pushed = load_file(str(download("memory.safetensors", "step-2")))
    assert len(local["labels"]) == 8 and (pushed["labels"] == local["labels"]).all()
    assert (pushed["images"] == local["images"]).all()


def test_model_card_says_what_the_model_is(hub: FakeHub, published: dict) -> None:
    card = hf.ModelCard.load(REPO, repo_type="model")
    assert card.data.library_name == "sbcli" and "class-incremental" in card.data.tags
    history = json.loads((published["step2"] / "learner.json").read_text())["history"]
    text = card.text
    for name in ("red", "green", "blue", "yellow"):
        assert name in text
    for h in history:
        assert f"| {h['step']} | {h['num_classes']} | {h['metrics']['overall']:.2f} |" in text
    assert "sb add-task my-learner" in text and "onnxruntime" in text and "step-2" in text
    assert "Training images inside: yes.** `memory.safetensors` holds the exemplar memory: 8 training images" in text
    step1_card = download("README.md", "step-1").read_text()
    assert "Training images inside: no." in step1_card and "--no-rehearsal" in step1_card


def test_pull_each_step_then_continue_learning(hub: FakeHub, published: dict, color_data, tmp_path: Path) -> None:
    report = api.pull(f"{REPO}@step-1", tmp_path / "s1")
    assert report.path == tmp_path / "s1" and report.revision == "step-1" and not report.from_cache
    assert sorted(p.name for p in (tmp_path / "s1").iterdir()) == LEARNER_FILES  # no .gitattributes, no cache files
    pulled, original = Learner.load(tmp_path / "s1"), Learner.load(published["step1"])
    assert pulled.state.class_names == original.state.class_names
    for key, value in original.model.state_dict().items():
        assert (pulled.model.state_dict()[key] == value).all(), key
    assert api.pull(REPO, tmp_path / "latest").path == tmp_path / "latest"
    assert Learner.load(tmp_path / "latest").state.num_classes == 4
    before = {p.name: p.read_bytes() for p in (tmp_path / "s1").iterdir() if not p.name.startswith(".")}
    with pytest.raises(LearnerError, match=r"holds no exemplars of 2 of its 2 classes .* pass --no-rehearsal"):
        api.add_task(tmp_path / "s1", color_data["task2_train"], color_data["task2_test"], device="cpu",
                     options=api.AddTaskOptions(epochs=1))
    after = {p.name: p.read_bytes() for p in (tmp_path / "s1").iterdir() if not p.name.startswith(".")}
    assert after == before  # refused before any work (the writer lock's file aside)
    step = api.add_task(tmp_path / "s1", color_data["task2_train"], color_data["task2_test"], device="cpu",
                        options=api.AddTaskOptions(epochs=1, no_rehearsal=True))
    assert step.step == 2 and Learner.load(tmp_path / "s1").state.class_names[2:] == ["blue", "yellow"]
    fates = [n for n in step.notes if n.startswith(("README.md", "model.onnx"))]
    assert len(fates) == 2 and all("describes step 1); `sb export" in n for n in fates), step.notes


def test_tampered_file_is_refused(hub: FakeHub, tmp_path: Path) -> None:
    """The zoo lists the hashes of REPO@step-2; a swapped file on the server is refused, and once the
    server is fixed the next pull succeeds (the bad copy was dropped from the cache)."""
    originals = {n: Path(hf.hf_hub_download(REPO, n, revision="step-2", cache_dir=tmp_path / "c")) for n in LEARNER_FILES}
    index = write_index(tmp_path / "index.toml", {n: sha256_file(p) for n, p in originals.items()})
    weights = originals["model.safetensors"].read_bytes()
    hub.set_file(REPO, "model.safetensors", b"evil weights", revision="step-2")
    for ref in ("colours", f"{REPO}@step-2"):  # the repository at the indexed revision is verified too
        with pytest.raises(ExportError, match="model.safetensors from .* does not match the zoo index"):
            api.pull(ref, tmp_path / "pulls" / "bad", index=index)
    assert list((tmp_path / "pulls").iterdir()) == []  # nothing half-installed
    hub.set_file(REPO, "model.safetensors", weights, revision="step-2")
    good = api.pull("colours", tmp_path / "pulls" / "good", index=index)
    assert good.verified == LEARNER_FILES and (tmp_path / "pulls" / "good" / "model.safetensors").read_bytes() == weights


def write_index(path: Path, hashes: dict[str, str]) -> Path:
    rows = "\n".join(f'"{n}" = "{h}"' for n, h in hashes.items())
    path.write_text(f'''format = 1
[entries.colours]
description = "test"
dataset = "synthetic colours"
class_order = ["red", "green", "blue", "yellow"]
tasks = [2, 2]
method = "std"
inference = "wa"
network = "resnet18 x0.125"
image_size = 16
recipe = "none"
location = "hub:{REPO}"
revision = "step-2"
build = "-"
[entries.colours.files]
{rows}
''')
    return path


def test_unknown_zoo_name_suggests_the_closest() -> None:
    res = CliRunner().invoke(app, ["pull", "demo-sb-tinny"])
    assert res.exit_code == 1
    assert "Unknown zoo entry 'demo-sb-tinny'" in res.output and "Did you mean 'demo-sb-tiny'" in res.output


def test_missing_revision_lists_the_existing_ones(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"has no revision 'step-9' \(it has: main, step-1, step-2\)"):
        api.pull(f"{REPO}@step-9", tmp_path / "x")
    with pytest.raises(ExportError, match="No model repository tester/missing"):
        api.pull("tester/missing", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_server_that_does_not_answer_fails_in_seconds(fake_hub: FakeHub, tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(ExportError, match="did not answer"):
        api.pull(REPO, tmp_path / "x", endpoint=dead_endpoint())
    with socket.socket() as silent:  # accepts connections but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        with pytest.raises(ExportError, match="did not answer: ReadTimeout"):
            api.pull(REPO, tmp_path / "x", endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
    assert time.monotonic() - start < 5
    assert not (tmp_path / "x").exists()


def test_cli_against_a_dead_server_without_patched_retries(tmp_path: Path) -> None:
    """A fresh process (no test patches): the error comes in seconds, not after 24 s of retries."""
    env = {**os.environ, "HF_ENDPOINT": dead_endpoint(), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "sbcli", "pull", REPO, "-o", str(tmp_path / "x")], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    elapsed = time.monotonic() - start
    assert out.returncode == 1 and "did not answer" in out.stderr and "Traceback" not in out.stderr
    assert elapsed < 20, elapsed  # imports included; the network part is a refused connection


def test_offline_serves_a_cached_pull(hub: FakeHub, request, tmp_path: Path) -> None:
    first = api.pull(f"{REPO}@step-1", tmp_path / "online")
    hub.stop()
    down = api.pull(f"{REPO}@step-1", tmp_path / "server-down", timeout=2)  # unreachable: the cache answers
    request.getfixturevalue("hf_offline")
    offline = api.pull(f"{REPO}@step-1", tmp_path / "offline")
    assert down.from_cache and offline.from_cache and not first.from_cache
    assert offline.commit == first.commit
    for name in LEARNER_FILES:
        assert (tmp_path / "offline" / name).read_bytes() == (tmp_path / "online" / name).read_bytes()
    with pytest.raises(ExportError, match="not in the local cache"):
        api.pull(f"{REPO}@step-2", tmp_path / "never-pulled")
    with pytest.raises(ExportError, match="HF_HUB_OFFLINE is set"):
        api.push(tmp_path / "offline", REPO)


def test_offline_flag_without_the_environment(hub: FakeHub, tmp_path: Path) -> None:
    api.pull(f"{REPO}@step-2", tmp_path / "a")
    requests = len(hub.requests)
    report = api.pull(f"{REPO}@step-2", tmp_path / "b", offline=True)
    assert report.from_cache and len(hub.requests) == requests  # not a single request


def test_file_names_escaping_the_target_are_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.set_file(REPO, "../escape.txt", b"gotcha", revision="step-1")
    with pytest.raises(ExportError, match="'../escape.txt', which would be written outside the target"):
        api.pull(f"{REPO}@step-1", tmp_path / "out" / "learner")
    assert not (tmp_path / "out" / "learner").exists() and not (tmp_path / "out" / "escape.txt").exists()
    assert not (tmp_path / "escape.txt").exists()
    for name in ("a/../b", "/etc/passwd", "C:/x", "a\\b", "./a", "a//b", ""):
        with pytest.raises(ExportError):
            safe_relpath(name)
    assert str(safe_relpath("sub/model.onnx")) == "sub/model.onnx"


def test_pull_refuses_an_existing_target_and_a_non_learner(hub: FakeHub, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(LearnerError, match="already exists"):
        api.pull(f"{REPO}@step-1", tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]
    hf.HfApi().create_repo("tester/not-a-learner")
    hf.HfApi().upload_file(path_or_fileobj=b"hello", path_in_repo="notes.txt", repo_id="tester/not-a-learner")
    with pytest.raises(LearnerError, match="tester/not-a-learner@main is not an sbcli learner"):
        api.pull("tester/not-a-learner", tmp_path / "nl")
    assert not (tmp_path / "nl").exists()


def test_pushing_an_earlier_step_again_leaves_main_alone(hub: FakeHub, published: dict) -> None:
    report = api.push(published["step1"], REPO, with_memory=True)
    assert list(report.revisions) == ["step-1"]
    assert len(json.loads(download("learner.json", "main").read_text())["class_names"]) == 4
    assert len(load_file(str(download("memory.safetensors", "step-1")))["labels"]) == 8


def relabelled(learner: Path, tmp_path: Path, names: list[str]) -> Path:
    """A copy of ``learner`` whose learner.json claims other classes (enough for the checks made before export)."""
    copy_dir = tmp_path / "other"
    shutil.copytree(learner, copy_dir)
    state = json.loads((copy_dir / "learner.json").read_text())
    steps = (len(names) + 1) // 2
    state["class_names"] = names
    state["class_task"] = [i // 2 for i in range(len(names))]
    state["tasks"] = [{**state["tasks"][0], "classes": names[2 * i: 2 * i + 2]} for i in range(steps)]
    state["history"] = [state["history"][0]] * steps
    state["kept_steps"] = {str(steps): state["files"]}  # format 2: the current step names its files
    state["hashes"] = {rel: state["hashes"][rel] for rel in state["files"].values()}  # and only its files' hashes
    record = {k: v for k, v in state.items() if k not in ("files", "kept_steps", "keep", "hashes", "objects")}
    raw = json.dumps(record).encode()  # the step's own record says the same (learner.json must agree with it)
    (copy_dir / state["files"]["state"]).write_bytes(raw)
    state["hashes"][state["files"]["state"]] = {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}
    (copy_dir / "learner.json").write_text(json.dumps(state))
    return copy_dir


@pytest.mark.parametrize(("names", "problem"), [
    (["red", "green", "purple", "cyan"], "@step-2 holds another learner"),
    (["red", "green", "purple", "cyan", "white", "black"], "holds another sequence on main"),
])
def test_another_sequence_never_overwrites_a_step(hub: FakeHub, published: dict, tmp_path: Path,
                                                 names: list[str], problem: str) -> None:
    before = {b.name: b.target_commit for b in hf.HfApi().list_repo_refs(REPO).branches}
    with pytest.raises(ExportError, match=problem):
        api.push(relabelled(published["step2"], tmp_path, names), REPO)
    assert {b.name: b.target_commit for b in hf.HfApi().list_repo_refs(REPO).branches} == before


def test_push_refusals(fake_hub: FakeHub, published: dict) -> None:
    with pytest.raises(ConfigError, match="not a Hub repository id"):
        api.push(published["step1"], "no-owner")
    with pytest.raises(ConfigError, match="NAME"):
        api.pull("tester/", None)


def test_cli_export_to_hub_then_pull(fake_hub: FakeHub, published: dict, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["export", str(published["step1"]), "--to-hub", "tester/cli-model"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    said = " ".join(res.stdout.split())
    assert "revisions main (" in said and "and step-1 (" in said and "argmax agreement 100.0 %" in said
    res = runner.invoke(app, ["pull", "tester/cli-model@step-1", "-o", str(tmp_path / "pulled")])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str(tmp_path / "pulled")
    assert f"sb add-task {tmp_path / 'pulled'}" in res.stderr and (tmp_path / "pulled" / "model.onnx").is_file()
    said = " ".join(res.stderr.split())
    assert "carries no exemplar memory (it was pushed without --with-memory)" in said and "--no-rehearsal" in said
    assert "it carries 16 held-out test images" in said
