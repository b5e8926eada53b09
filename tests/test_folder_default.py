"""`sb train FOLDER` starts from EfficientNet-Lite0's ImageNet weights under the ridge head unless a backbone, an
architecture, a trained method or a recipe is asked; `--pretrained none` trains from scratch (STD + WA); the demo
and the paper's benchmarks stay on Split-and-Bridge. Where the weight package is not installed, the default says
in one sentence what to install or to pass, before any work. Settings only: no image is read here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.config.options import FOLDER_BACKBONE, build_options
from sbcli.errors import ConfigError


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    for cls in ("cat", "dog"):
        (tmp_path / "photos" / "train" / cls).mkdir(parents=True)
    return tmp_path / "photos" / "train"


def _method_and_backbone(source: str | None, **settings) -> tuple[str, str | None]:
    _, run = api.options(source, **settings)
    return run.method, run.pretrained


def test_a_folder_starts_from_efficientnet_lite0_under_the_ridge_head(photos):
    assert _method_and_backbone(str(photos)) == ("ranpac", FOLDER_BACKBONE)
    assert _method_and_backbone(str(photos), method="simplecil") == ("simplecil", FOLDER_BACKBONE)
    _, run = api.options(str(photos))
    assert run.arch == "timm/tf_efficientnet_lite0" and run.width == 1.0


@pytest.mark.parametrize(("settings", "expected"), [
    ({"pretrained": "none"}, ("std", None)),  # from scratch, as asked
    ({"method": "std"}, ("std", None)),  # a trained method trains its own network
    ({"method": "sb"}, ("sb", None)),
    ({"arch": "resnet32"}, ("std", None)),  # an architecture asked: that network, from scratch
    ({"inference": "icarl"}, ("std", None)),  # a trained method's inference rule: STD, from scratch
    ({"pretrained": "random"}, ("std", "random")),
])
def test_what_is_asked_keeps_the_folder_off_the_default_backbone(photos, settings, expected):
    assert _method_and_backbone(str(photos), **settings) == expected


@pytest.mark.parametrize("source", [None, "demo", "cifar100", "tiny-imagenet"])
def test_the_demo_and_the_papers_benchmarks_stay_on_split_and_bridge(source):
    settings = {"data_root": "somewhere"} if source == "tiny-imagenet" else {}
    assert _method_and_backbone(source, **settings) == ("sb", None)


def test_a_resumed_learner_that_grew_from_scratch_goes_on_from_scratch(photos, tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "learner.json").write_text(json.dumps({"provenance": {"pretrained": None}}))
    _, run, _ = build_options({"source": str(photos), "out": str(out), "resume": True})
    assert run.method == "std" and run.pretrained is None


def test_without_the_weight_package_the_folder_default_says_what_to_install_before_any_work(photos, tmp_path, monkeypatch):
    def missing(pkg):
        raise ConfigError(f"{pkg.distribution} is not installed")

    monkeypatch.setattr("sbcli.hub.weight_packages.source_file", missing)
    res = CliRunner().invoke(app, ["train", str(photos), "--out", str(tmp_path / "x"), "--device", "cpu"])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "pip install 'sbcli[pretrained]'" in text and "--pretrained none" in text, res.output
    assert "Traceback" not in res.output and not (tmp_path / "x").exists()
    assert _method_and_backbone(str(photos), pretrained="none") == ("std", None)  # the way out needs no package


def test_the_help_states_the_default_with_its_figures():
    res = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400"})
    text = " ".join(res.output.replace("│", " ").split())
    assert "`none` trains from scratch" in text and "efficientnet-lite0 under the ridge head" in text
    assert "68.5 % last on CIFAR-10 in 5 tasks" in text


def test_the_ridge_head_on_a_weight_package_takes_no_projection_unless_one_is_asked(photos):
    for settings, expected in (({}, 0), ({"pretrained": "efficientnet-lite1"}, 0), ({"projection": 2000}, 2000)):
        _, run = api.options(str(photos), **settings)
        assert run.method == "ranpac" and run.method_options["projection"] == expected, settings
