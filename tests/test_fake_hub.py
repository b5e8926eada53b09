"""The real huggingface_hub client against the loopback FakeHub."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import huggingface_hub as hf
import pytest
from fake_hub import FakeHub, dead_endpoint, git_blob_sha1
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

# fixtures fake_hub, hf_offline, no_internet come from conftest.py (imported from conftest_hub)
REPO = "tester/cil-model"


def write_folder(root: Path, files: dict[str, str]) -> Path:
    """Create ``files`` (relative path -> text) under ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def stepped_repo(fake_hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    """main + branch step-1 (= first upload) + branch step-2 (changed files). Returns commit ids."""
    api = hf.HfApi()
    api.create_repo(REPO)
    api.create_repo(REPO, exist_ok=True)
    first = write_folder(tmp_path / "v1", {"config.json": '{"step": 1}', "weights.bin": "w1", "sub/notes.txt": "n"})
    c1 = api.upload_folder(repo_id=REPO, folder_path=first, commit_message="step 1")
    api.create_branch(REPO, branch="step-1")
    api.create_branch(REPO, branch="step-2", revision="step-1")
    second = write_folder(tmp_path / "v2", {"config.json": '{"step": 2}', "weights.bin": "w2", "extra.txt": "e"})
    c2 = api.upload_folder(
        repo_id=REPO, folder_path=second, revision="step-2", commit_message="step 2", delete_patterns=["sub/*"]
    )
    return {"step-1": c1.oid, "step-2": c2.oid}


def test_revisions_keep_each_step(stepped_repo: dict[str, str]) -> None:
    def read(filename: str, revision: str) -> str:
        return Path(hf.hf_hub_download(REPO, filename, revision=revision)).read_text()

    assert read("config.json", "step-1") == '{"step": 1}'
    assert read("config.json", "step-2") == '{"step": 2}'
    assert read("weights.bin", stepped_repo["step-1"]) == "w1"  # by commit sha
    assert read("weights.bin", "main") == "w1"  # step-2 went to its branch only
    api = hf.HfApi()
    assert api.list_repo_files(REPO, revision="step-1") == [
        ".gitattributes",
        "config.json",
        "sub/notes.txt",
        "weights.bin",
    ]
    assert api.list_repo_files(REPO, revision="step-2") == [".gitattributes", "config.json", "extra.txt", "weights.bin"]
    assert api.model_info(REPO, revision="step-2").sha == stepped_repo["step-2"]
    history = api.list_repo_commits(REPO, revision="step-2")
    assert [c.title for c in history] == ["step 2", "step 1", "initial commit"]


def test_refs_tags_and_file_exists(stepped_repo: dict[str, str]) -> None:
    api = hf.HfApi()
    api.create_tag(REPO, tag="v1", revision="step-1")
    refs = api.list_repo_refs(REPO)
    assert {b.name: b.target_commit for b in refs.branches} == {
        "main": stepped_repo["step-1"],
        "step-1": stepped_repo["step-1"],
        "step-2": stepped_repo["step-2"],
    }
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", stepped_repo["step-1"])]
    assert api.file_exists(REPO, "extra.txt", revision="step-2")
    assert not api.file_exists(REPO, "extra.txt", revision="v1")
    with pytest.raises(HfHubHTTPError) as err:
        api.create_branch(REPO, branch="step-1")
    assert err.value.response.status_code == 409
    api.create_branch(REPO, branch="step-1", exist_ok=True)


def test_upload_file_skips_unchanged_and_checks_parent(fake_hub: FakeHub) -> None:
    api = hf.HfApi()
    api.create_repo(REPO)
    first = api.upload_file(path_or_fileobj=b"a", path_in_repo="a.txt", repo_id=REPO)
    again = api.upload_file(path_or_fileobj=b"a", path_in_repo="a.txt", repo_id=REPO)
    assert again.oid == first.oid  # nothing changed: the client skips the commit
    op = hf.CommitOperationAdd("b.txt", b"b")
    with pytest.raises(HfHubHTTPError):
        api.create_commit(REPO, [op], commit_message="stale", parent_commit="0" * 40)
    api.create_commit(REPO, [op], commit_message="fresh", parent_commit=first.oid)
    assert api.list_repo_files(REPO) == [".gitattributes", "a.txt", "b.txt"]


def test_dataset_repo_tags_and_deletes(fake_hub: FakeHub) -> None:
    api = hf.HfApi()
    api.create_repo("tester/data", repo_type="dataset")
    api.upload_file(path_or_fileobj=b"1,2", path_in_repo="train/a.csv", repo_id="tester/data", repo_type="dataset")
    api.create_tag("tester/data", tag="v1", repo_type="dataset")
    api.delete_file("train/a.csv", repo_id="tester/data", repo_type="dataset")
    assert api.list_repo_files("tester/data", repo_type="dataset") == [".gitattributes"]
    path = hf.hf_hub_download("tester/data", "train/a.csv", repo_type="dataset", revision="v1")
    assert Path(path).read_bytes() == b"1,2"
    assert ("HEAD", "/datasets/tester/data/resolve/v1/train/a.csv") in fake_hub.requests
    api.delete_repo("tester/data", repo_type="dataset")
    assert not api.repo_exists("tester/data", repo_type="dataset")


def test_snapshot_download_cache_and_local_dir(stepped_repo: dict[str, str], tmp_path: Path) -> None:
    cached = Path(hf.snapshot_download(REPO, revision="step-1"))
    assert cached.name == stepped_repo["step-1"]
    assert (cached / "sub" / "notes.txt").read_text() == "n"
    local = Path(hf.snapshot_download(REPO, revision="step-2", local_dir=tmp_path / "out"))
    got = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file() and ".cache" not in p.parts)
    assert got == [".gitattributes", "config.json", "extra.txt", "weights.bin"]
    assert (local / "weights.bin").read_text() == "w2"


def test_model_card_push_and_load(fake_hub: FakeHub) -> None:
    hf.HfApi().create_repo(REPO)
    card = hf.ModelCard.from_template(hf.ModelCardData(license="mit", tags=["continual-learning"]), model_id="cil")
    card.text += "\nTrained with sbcli.\n"
    card.push_to_hub(REPO)
    loaded = hf.ModelCard.load(REPO)
    assert loaded.data.license == "mit" and loaded.data.tags == ["continual-learning"]
    assert "Trained with sbcli." in loaded.text
    assert ("POST", "/api/validate-yaml") in fake_hub.requests


def test_not_found_errors(stepped_repo: dict[str, str]) -> None:
    with pytest.raises(RepositoryNotFoundError):
        hf.hf_hub_download("tester/missing", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        hf.HfApi().model_info("tester/missing")
    with pytest.raises(RevisionNotFoundError):
        hf.hf_hub_download(REPO, "config.json", revision="step-99")
    with pytest.raises(RevisionNotFoundError):
        hf.snapshot_download(REPO, revision="step-99")
    with pytest.raises(EntryNotFoundError):
        hf.hf_hub_download(REPO, "nope.bin", revision="step-2")


def test_offline_serves_cached_download(stepped_repo: dict[str, str], fake_hub: FakeHub, request) -> None:
    path = hf.hf_hub_download(REPO, "config.json", revision="step-2")
    request.getfixturevalue("hf_offline")
    fake_hub.stop()
    assert hf.hf_hub_download(REPO, "config.json", revision="step-2") == path
    assert Path(hf.snapshot_download(REPO, revision="step-2")) == Path(path).parent
    with pytest.raises(LocalEntryNotFoundError):
        hf.hf_hub_download(REPO, "weights.bin", revision="step-2")


def test_tampered_file_is_served_as_is(stepped_repo: dict[str, str], fake_hub: FakeHub) -> None:
    fake_hub.set_file(REPO, "weights.bin", b"evil", revision="step-2")
    path = hf.hf_hub_download(REPO, "weights.bin", revision="step-2")
    assert Path(path).read_bytes() == b"evil"
    assert hf.HfApi().model_info(REPO, revision="step-2").sha == stepped_repo["step-2"]


def test_resolve_headers_and_range(stepped_repo: dict[str, str], fake_hub: FakeHub) -> None:
    url = f"{fake_hub.endpoint}/{REPO}/resolve/step-1/config.json"
    etag = '"%s"' % git_blob_sha1(b'{"step": 1}')
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=2-"})) as resp:
        assert (resp.status, resp.read()) == (206, b'step": 1}')
        assert resp.headers["Content-Range"] == "bytes 2-10/11"
        assert resp.headers["ETag"] == etag
        assert resp.headers["X-Repo-Commit"] == stepped_repo["step-1"]


def test_subprocess_sees_the_fake_hub(stepped_repo: dict[str, str]) -> None:
    code = "import huggingface_hub as h; print(open(h.hf_hub_download('%s', 'extra.txt', revision='step-2')).read())"
    out = subprocess.run([sys.executable, "-c", code % REPO], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "e"


def test_unreachable_and_failing_servers_fail_fast(fake_hub: FakeHub, tmp_path: Path) -> None:
    start = time.monotonic()
    dead = dead_endpoint()
    with pytest.raises(Exception, match="onnect"):
        hf.HfApi(endpoint=dead).model_info(REPO)
    with pytest.raises(LocalEntryNotFoundError):  # 6 tries, no backoff wait under the fixture
        hf.hf_hub_download(REPO, "config.json", endpoint=dead)
    fake_hub.fail_status = 503
    with pytest.raises(HfHubHTTPError) as err:
        hf.HfApi().model_info(REPO)
    assert err.value.response.status_code == 503
    with pytest.raises(LocalEntryNotFoundError):
        hf.snapshot_download(REPO, local_dir=tmp_path / "nothing")
    assert time.monotonic() - start < 5


def test_no_internet_guard_blocks_real_hub(no_internet: None) -> None:
    with pytest.raises(Exception, match="BLOCKED non-loopback lookup"):
        hf.HfApi(endpoint="https://huggingface.co").model_info("gpt2")
