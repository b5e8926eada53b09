"""`sb pull` builds no path from remote input that leaves its target: hostile input planted at every place
a remote name enters (the revision on the command line and in a zoo index entry, the index's repository and
file names, the file names a Hub listing holds, the commit id it answers), answered by a FakeHub that
accepts it. Each is refused in one sentence, before any request where the input is ours to check, and
nothing is written anywhere but the target and the repository's own folder of the Hub cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_hub import FakeHub, Repo
from test_learner import ZOO_V1
from test_store_cli import invoke, refused

REPO = "evil/repo"
HOSTILE_REVISIONS = ["../../../../escaped", "main/../../../../../escaped", "/tmp/escaped", "..", "a\\b",
                     "x\x1b[31m", "line\nbreak", ".hidden", "a//b", "head.lock", "x" * 256]
HOSTILE_NAMES = ["../../../../escaped", "a/../../../../../escaped", "/tmp/escaped-abs", "a\\b", "C:/x",
                 "ctl\x1b[2J.txt", "nul\0byte"]


def files_under(root: Path) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs}


@pytest.fixture
def world(fake_hub: FakeHub, tmp_path: Path, monkeypatch) -> dict:
    """A Hub repository holding a small learner (format 1), a working directory, and what exists already."""
    repo = Repo("model", REPO, False)
    repo.add_commit("main", "learner", "", {p.name: p.read_bytes() for p in ZOO_V1.iterdir()})
    fake_hub.repos["model", REPO] = repo
    work = tmp_path / "a" / "b" / "c" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return {"hub": fake_hub, "root": tmp_path, "before": files_under(tmp_path), "target": work / "pulled",
            "cache": tmp_path / "hf_home" / "hub" / "models--evil--repo"}


def written_outside(world: dict) -> list[str]:
    """New files that are neither in the target nor in the repository's folder of the Hub cache (or its lock files)."""
    cache = world["cache"]
    allowed = tuple(os.path.realpath(p) + os.sep for p in (world["target"], cache, cache.parent / ".locks" / cache.name))
    new = files_under(world["root"]) - world["before"] - {str(cache.parent / "CACHEDIR.TAG")}  # the client's marker
    return sorted(p for p in new if not os.path.realpath(p).startswith(allowed) or ".." in Path(p).parts)


def index_with(world: dict, **fields: str) -> Path:
    entry = {"location": f"hub:{REPO}", "revision": "main", **fields}
    files = entry.pop("files", '"model.safetensors" = "' + "0" * 64 + '"')
    rows = "\n".join(f"{k} = {v!r}".replace("'", '"') if "\\" not in v else f"{k} = '{v}'" for k, v in entry.items())
    path = world["root"] / "index.toml"
    path.write_text(f"""format = 1
[entries.evil]
description = "test"
dataset = "x"
class_order = ["a", "b"]
tasks = [2]
method = "std"
inference = "wa"
network = "resnet18 x0.125"
image_size = 16
recipe = "none"
build = "-"
{rows}
[entries.evil.files]
{files}
""", encoding="utf-8")
    world["before"] = files_under(world["root"])
    return path


@pytest.mark.parametrize("revision", HOSTILE_REVISIONS, ids=range(len(HOSTILE_REVISIONS)))
def test_a_hostile_revision_on_the_command_line_is_refused_before_any_request(world, revision):
    world["hub"].any_revision = True  # a server that would answer it
    refused(invoke("pull", f"{REPO}@{revision}", "-o", world["target"]), "revision")
    assert world["hub"].requests == [] and written_outside(world) == [] and not world["target"].exists()


@pytest.mark.parametrize("revision", HOSTILE_REVISIONS[:5], ids=range(5))
def test_a_hostile_revision_in_a_zoo_index_entry_is_refused_before_any_request(world, revision):
    world["hub"].any_revision = True
    index = index_with(world, revision=revision)
    refused(invoke("pull", "evil", "--index", index, "-o", world["target"]), "revision")
    assert world["hub"].requests == [] and written_outside(world) == []


@pytest.mark.parametrize("fields", [{"location": "hub:evil/../../../escaped"}, {"location": "hub:/tmp/x"},
                                    {"files": '"../../../../escaped" = "' + "0" * 64 + '"'},
                                    {"files": '"/tmp/escaped" = "' + "0" * 64 + '"'}], ids=range(4))
def test_a_hostile_repository_or_file_name_in_a_zoo_index_is_refused_before_any_request(world, fields):
    index = index_with(world, **fields)
    refused(invoke("pull", "evil", "--index", index, "-o", world["target"]), "Zoo entry evil", "fix the index")
    assert world["hub"].requests == [] and written_outside(world) == []


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_a_hostile_file_name_in_the_hubs_listing_is_refused_before_any_download(world, name):
    world["hub"].listed = {name: b"gotcha"}
    refused(invoke("pull", REPO, "-o", world["target"]), "outside the target directory")
    assert not any("/resolve/" in path for _, path in world["hub"].requests)  # no file was downloaded
    assert written_outside(world) == [] and not world["target"].exists()


@pytest.mark.parametrize("sha", ["../../../../escaped", "0" * 39 + "/", "A" * 40, "../" * 13 + "x"], ids=range(4))
def test_a_commit_id_that_is_not_one_is_refused_before_any_download(world, sha):
    world["hub"].reported_sha = sha
    refused(invoke("pull", REPO, "-o", world["target"]), "not a commit id")
    assert not any("/resolve/" in path for _, path in world["hub"].requests)
    assert written_outside(world) == [] and not world["target"].exists()


def test_names_only_a_later_listing_holds_are_never_fetched(world):
    """The download is pinned to the files and the commit checked first: a tree listing that adds hostile
    names (a server answering otherwise the second time) gets none of them written anywhere."""
    world["hub"].tree_only = {name: b"gotcha" for name in HOSTILE_NAMES if "\0" not in name}
    res = invoke("pull", REPO, "-o", world["target"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in world["target"].iterdir()) == sorted(p.name for p in ZOO_V1.iterdir())
    assert written_outside(world) == []
    assert not any("gotcha" in Path(p).name or "escaped" in p for p in files_under(world["root"]) - world["before"])


def test_a_pulled_branch_is_found_offline_by_its_name(world, request):
    """The cache's ref for a branch is written by sbcli now (the download is pinned to the commit)."""
    assert invoke("pull", f"{REPO}@main", "-o", world["target"]).exit_code == 0
    request.getfixturevalue("hf_offline")
    res = invoke("pull", f"{REPO}@main", "-o", world["target"].with_name("again"))
    assert res.exit_code == 0, res.output
