"""The zoo index, its recipes, the bundled learner, and `sb pull` of zoo names (offline)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.config.recipes import find_recipe
from sbcli.data.scenario import class_order
from sbcli.errors import ConfigError, ExportError
from sbcli.hub.zoo import ZOO_DIRS, ZooEntry, load_index, sha256_file
from sbcli.learner.state import read_state
from sbcli.metrics import summary

INDEX = load_index()
ENTRIES = list(INDEX.entries.values())
BUNDLED = [e for e in ENTRIES if e.kind == "bundled"]
ROOT = Path(__file__).resolve().parents[1]


def ids(entry: ZooEntry) -> str:
    return entry.name


def test_the_zoo_has_an_offline_entry_and_lives_where_the_package_finds_it() -> None:
    assert BUNDLED, "at least one entry must be bundled so that `sb pull` works without network"
    assert INDEX.folder in (d.resolve() for d in ZOO_DIRS)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]["zoo"] == "sbcli/_zoo"


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_every_entry_names_the_recipe_its_build_command_uses(entry: ZooEntry) -> None:
    path = INDEX.recipe_path(entry)
    recipe = tomllib.loads(path.read_text())
    assert recipe["method"] == entry.method
    if entry.kind == "build":  # learned by `sb pull NAME --data FILE` on the backbone's recipe (tests/test_zoo_build.py)
        assert entry.network == recipe["arch"] and recipe["pretrained"] == entry.target
        assert shlex.split(entry.build)[:4] == ["sb", "pull", entry.name, "--data"]
        return
    if entry.holds == "learner":  # a backbone's network is its weights' architecture (tests/test_backbone_learner.py)
        assert entry.network == f"{recipe.get('arch', 'resnet18')} x{recipe['width']}"
        assert recipe["tasks"] == len(entry.tasks)
    args = shlex.split(entry.build.split("#")[0])
    assert args[:2] == ["sb", "train"] and "--recipe" in args
    source = args[2] if not args[2].startswith("-") else None
    assert find_recipe(args[args.index("--recipe") + 1], source).resolve() == path.resolve()


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.kind == "unpublished"], ids=ids)
def test_unpublished_entries_claim_no_location_and_say_how_to_build(entry: ZooEntry, tmp_path: Path) -> None:
    assert not entry.files and entry.revision is None and entry.target == ""
    with pytest.raises(ConfigError, match="not published anywhere; build it locally") as err:
        api.pull(entry.name, tmp_path / "x")
    assert entry.build in str(err.value) and not (tmp_path / "x").exists()


@pytest.mark.parametrize("entry", BUNDLED, ids=ids)
def test_bundled_files_are_exactly_the_listed_ones_with_their_hashes(entry: ZooEntry) -> None:
    folder = INDEX.bundled_dir(entry)
    assert sorted(p.name for p in folder.iterdir()) == sorted(entry.files)
    for name, digest in entry.files.items():
        assert sha256_file(folder / name) == digest, name
    assert sum((folder / n).stat().st_size for n in entry.files) < 4_000_000  # a few MB at most


@pytest.mark.parametrize("entry", BUNDLED, ids=ids)
def test_bundled_learner_is_what_its_entry_and_recipe_say(entry: ZooEntry) -> None:
    state = read_state(INDEX.bundled_dir(entry))
    recipe = tomllib.loads(INDEX.recipe_path(entry).read_text())
    assert state.class_names == entry.class_order
    assert [state.class_task.count(t) for t in range(state.steps)] == entry.tasks
    assert (state.method, state.method_config.inference) == (entry.method, entry.inference)
    assert f"{state.arch} x{state.width}" == entry.network and state.image_size == entry.image_size
    assert state.plan.scenario["order"] == class_order(entry.num_classes, recipe["order_seed"])
    assert state.plan.data_source.kind == recipe["source"]
    train = state.train_config
    assert (train.epochs, train.batch_size, train.lr) == (recipe["epochs"], recipe["batch_size"], recipe["lr"])
    assert state.memory.to_json() == {"budget": recipe["memory"], "selection": recipe["selection"], "seed": recipe["seed"]}
    overall = [h.metrics.overall for h in state.history]
    measured = summary(overall, [h.metrics.per_task for h in state.history])
    assert entry.metrics["accuracy_per_step"] == [round(v, 2) for v in overall]
    for key in ("avg_incremental_2_to_T", "avg_incremental_1_to_T", "last", "forgetting"):
        assert entry.metrics[key] == round(getattr(measured, key), 2), key


@pytest.mark.parametrize("entry", BUNDLED, ids=ids)
def test_pulled_bundled_learner_reproduces_its_metrics(entry: ZooEntry, no_internet, tmp_path: Path) -> None:
    report = api.pull(entry.name, tmp_path / "pulled")
    assert report.verified == sorted(entry.files) and report.origin == f"zoo entry {entry.name} (bundled)"
    result = api.evaluate(tmp_path / "pulled", device="cpu")
    assert abs(result.metrics.overall - entry.metrics["last"]) <= 100 / result.test_images + 0.01


def test_sb_pull_of_the_bundled_entry_needs_no_network_nor_hub_library(tmp_path: Path) -> None:
    """A fresh process with no reachable Hub and huggingface_hub made unimportable."""
    name = BUNDLED[0].name
    code = ("import sys; sys.modules['huggingface_hub'] = None; sys.argv = ['sb', 'pull', %r, '-o', %r]; "
            "from sbcli.cli.app import main; main()") % (name, str(tmp_path / "learner"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "learner")
    assert "files verified against the zoo index" in out.stderr
    assert read_state(tmp_path / "learner").class_names == BUNDLED[0].class_order


def test_default_target_is_the_entry_name_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    report = api.pull(BUNDLED[0].name)
    assert report.path == tmp_path / BUNDLED[0].name and (report.path / "learner.json").is_file()
    with pytest.raises(ConfigError, match="has one revision; drop '@v2'"):
        api.pull(f"{BUNDLED[0].name}@v2", tmp_path / "other")


def test_tampered_bundled_copy_is_refused(tmp_path: Path) -> None:
    entry = BUNDLED[0]
    zoo = tmp_path / "zoo"
    shutil.copytree(INDEX.folder, zoo, ignore=shutil.ignore_patterns("recipes"))
    weights = zoo / entry.target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportError, match="model.safetensors from zoo entry .* does not match the zoo index"):
        api.pull(entry.name, tmp_path / "out", index=zoo / "index.toml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoo"]


def test_list_shows_every_entry_and_where_it_lives() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["pull", "--list"], env={"COLUMNS": "80"})  # a plain terminal: names stay whole
    assert res.exit_code == 0, res.output
    for entry in ENTRIES:
        where = entry.kind if entry.kind != "hub" else entry.target.split("/")[0]  # a repository may fold
        assert entry.name in res.stdout and where in res.stdout
    res = runner.invoke(app, ["pull", "--list", "--json"])
    listed = json.loads(res.stdout)
    assert [e["name"] for e in listed] == [e.name for e in ENTRIES]
    assert {e["kind"] for e in listed} <= {"bundled", "hub", "package", "build", "unpublished"}
    res = runner.invoke(app, ["pull"])
    assert res.exit_code == 2 and "--list" in res.output


BASE = '''format = 1
[entries.{name}]
description = "d"
dataset = "demo"
class_order = ["a", "b"]
tasks = [1, 1]
method = "sb"
inference = "wa"
network = "resnet18 x0.125"
image_size = 32
recipe = "demo-sb-tiny"
build = "sb train --recipe demo-sb-tiny"
{extra}
'''


@pytest.mark.parametrize(("name", "extra", "problem"), [
    ("x", 'location = "hub:a/b"', "names no revision"),
    ("x", 'location = "ftp:a/b"', "use bundled:PATH, hub:OWNER/NAME, package:NAME, build:PACKAGE or unpublished"),
    ("x", 'location = "package:efficientnet-lite0"', "holds a backbone only"),
    ("x", 'location = "unpublished"\nrevision = "main"', "is unpublished but lists"),
    ("x", 'location = "bundled:learners/x"', "lists no file hashes"),
    ("x", 'location = "bundled:learners/x"\n[entries.x.files]\n"a" = "abc"', "not a SHA-256"),
    ("x", 'location = "unpublished"\ncolour = "red"', "missing or unknown fields"),
    ("Bad Name", 'location = "unpublished"', "must be lower-case"),
])
def test_index_mistakes_are_reported(name: str, extra: str, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "index.toml"
    path.write_text(BASE.format(name=f'"{name}"' if " " in name else name, extra=extra))
    with pytest.raises(ConfigError, match=problem):
        load_index(path)


def test_bundled_location_cannot_leave_the_zoo(tmp_path: Path) -> None:
    path = tmp_path / "index.toml"
    digest = "0" * 64
    path.write_text(BASE.format(name="x", extra=f'location = "bundled:../../etc"\n[entries.x.files]\n"passwd" = "{digest}"'))
    with pytest.raises(ConfigError, match="points outside the zoo"):
        api.pull("x", tmp_path / "out", index=path)
    (tmp_path / "bad.toml").write_text("format = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_index(tmp_path / "bad.toml")


def test_list_shows_an_indexs_text_as_written_never_as_markup_or_terminal_codes(tmp_path: Path) -> None:
    path = tmp_path / "index.toml"
    index = BASE.format(name="x", extra='location = "unpublished"')
    index = index.replace('dataset = "demo"', 'dataset = "[b]d[/]\\u001b[2J"')
    path.write_text(index)
    res = CliRunner().invoke(app, ["pull", "--list", "--index", str(path)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "[b]d[/]" in res.stdout  # shown as written, not read as rich markup
    assert "\x1b" not in res.stdout and "\\x1b[2J" in res.stdout
