"""``--pretrained``: safetensors backbones from the (local, fake) Hub or a file, mapped from timm's names,
recorded in learner.json, and every refusal (pickle, not safetensors, another architecture, wrong hash)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from fake_hub import FakeHub
from safetensors.torch import save, save_file
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError, ExportError
from sbcli.hub import pretrained
from sbcli.hub.zoo import sha256_file
from sbcli.nets import create_model

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = "timm-like/resnet18-tiny"
WIDTH = 0.125


def timm_name(ours: str) -> str:
    """Our parameter name in timm's/torchvision's ResNet layout (the inverse of map_timm_keys)."""
    if ours.startswith("head."):
        return "fc." + ours[len("head."):]
    if not ours.startswith("stages."):
        return ours
    _, stage, block, rest = ours.split(".", 3)
    rest = rest.replace("shortcut_bn.", "downsample.1.").replace("shortcut.", "downsample.0.")
    return f"layer{int(stage) + 1}.{block}.{rest}"


def timm_checkpoint(arch: str = "resnet18-in", seed: int = 7) -> dict[str, torch.Tensor]:
    """A checkpoint as timm saves it: timm's names, a 1000-class fc, no num_batches_tracked."""
    torch.manual_seed(seed)
    model = create_model(arch, 1000, WIDTH)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.running_mean.uniform_(-0.1, 0.1)
    return {timm_name(k): v.contiguous() for k, v in model.state_dict().items() if "num_batches_tracked" not in k}


def publish(hub_api, repo: str, files: dict[str, bytes], message: str = "weights") -> str:
    hub_api.create_repo(repo, exist_ok=True)
    from huggingface_hub import CommitOperationAdd

    ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=io.BytesIO(data)) for name, data in files.items()]
    return hub_api.create_commit(repo, operations=ops, commit_message=message).oid


@pytest.fixture
def hub_api(fake_hub: FakeHub):
    import huggingface_hub as hf

    return hf.HfApi()


def test_timm_names_map_onto_ours_one_to_one():
    assert pretrained.map_timm_keys("layer4.0.downsample.1.running_var") == "stages.3.0.shortcut_bn.running_var"
    assert pretrained.map_timm_keys("layer1.1.conv2.weight") == "stages.0.1.conv2.weight"
    assert pretrained.map_timm_keys("bn1.bias") == "bn1.bias" and pretrained.map_timm_keys("fc.weight") is None
    ours = create_model("resnet34-in", 5, WIDTH).state_dict()
    assert {pretrained.map_timm_keys(timm_name(k)) for k in ours if not k.startswith("head.")} == \
        {k for k in ours if not k.startswith("head.")}


def test_from_the_hub_the_backbone_is_loaded_the_head_is_new_and_the_record_says_what(hub_api, tmp_path, request):
    weights = timm_checkpoint()
    commit = publish(hub_api, REPO, {"model.safetensors": save(weights), "pytorch_model.bin": b"\x80 pickled"})
    loaded = pretrained.load(REPO, "resnet18-in", WIDTH)
    torch.manual_seed(0)
    model = create_model("resnet18-in", 3, WIDTH)
    head = model.head.weight.detach().clone()
    pretrained.apply(model, loaded)
    state = model.state_dict()
    for name, tensor in weights.items():
        if not name.startswith("fc."):
            torch.testing.assert_close(state[pretrained.map_timm_keys(name)], tensor, rtol=0, atol=0)
    assert torch.equal(model.head.weight, head) and model.num_classes == 3
    record = loaded.record
    assert record["repo"] == REPO and record["revision"] == "main" and record["commit"] == commit
    cached = Path(hub_api.snapshot_download(REPO, revision=commit, allow_patterns=["model.safetensors"]))
    assert record["sha256"] == sha256_file(cached / "model.safetensors")
    # offline: the same file from the cache, nothing asked of the Hub
    request.getfixturevalue("hf_offline")
    assert pretrained.load(REPO, "resnet18-in", WIDTH).record == record


def test_a_revision_picks_older_weights(hub_api):
    first = publish(hub_api, REPO, {"model.safetensors": save(timm_checkpoint(seed=1))})
    publish(hub_api, REPO, {"model.safetensors": save(timm_checkpoint(seed=2))}, message="newer")
    old = pretrained.load(f"{REPO}@{first}", "resnet18-in", WIDTH)
    new = pretrained.load(REPO, "resnet18-in", WIDTH)
    assert old.record["commit"] == first and new.record["commit"] != first
    key = "stages.0.0.conv1.weight"
    assert torch.equal(old.tensors[key], timm_checkpoint(seed=1)["layer1.0.conv1.weight"])
    assert not torch.equal(old.tensors[key], new.tensors[key])


def test_sb_train_records_the_weights_in_learner_json(hub_api, tmp_path):
    from conftest import write_class_folder

    publish(hub_api, REPO, {"model.safetensors": save(timm_checkpoint())})
    train = write_class_folder(tmp_path / "train", ["red", "green"], 8, size=32, seed=1)
    test = write_class_folder(tmp_path / "test", ["red", "green"], 4, size=32, seed=2)
    run = api.RunOptions(method="finetune", arch="resnet18-in", width=WIDTH, memory=4, device="cpu",
                         train=TrainConfig(epochs=1, batch_size=8, lr=0.0, weight_decay=0.0), pretrained=REPO)
    learner = api.train(api.SequenceOptions(source=str(train), test=str(test), image_size=32, tasks=1), run, tmp_path / "l")
    state = json.loads((tmp_path / "l" / "learner.json").read_text())
    record = state["provenance"]["pretrained"]
    assert record["repo"] == REPO and record["sha256"] and len(record["commit"]) == 40
    assert state["normalization"]["mean"] == pytest.approx([0.485, 0.456, 0.406])  # the weights' statistics
    # lr 0: the convolutions are still exactly the pretrained ones
    torch.testing.assert_close(learner.model.stages[3][1].conv2.weight.detach(),
                               timm_checkpoint()["layer4.1.conv2.weight"], rtol=0, atol=0)


def test_an_sbcli_learners_weights_load_from_a_file(tmp_path):
    torch.manual_seed(3)
    source = create_model("resnet18", 10, 0.25)
    path = tmp_path / "model.safetensors"
    save_file({**source.state_dict(), "extra.class_means": torch.zeros(10, 128)}, str(path))
    loaded = pretrained.load(str(path), "resnet18", 0.25)
    assert loaded.record["source"] == "file" and loaded.record["sha256"] == sha256_file(path)
    target = create_model("resnet18", 4, 0.25)
    pretrained.apply(target, loaded)
    assert torch.equal(target.stages[2][0].conv1.weight, source.stages[2][0].conv1.weight)


# --------------------------------------------------------------------------------------------
# Refusals: one sentence, nothing trained, nothing written
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "width"), [("resnet34-in", WIDTH), ("resnet18", WIDTH), ("resnet18-in", 0.25)])
def test_another_architecture_is_refused(hub_api, arch, width):
    publish(hub_api, REPO, {"model.safetensors": save(timm_checkpoint())})
    with pytest.raises(ConfigError, match=f"does not match --arch {arch}"):
        pretrained.load(REPO, arch, width)


def test_a_pickle_checkpoint_is_refused_on_the_hub_and_on_disk(hub_api, tmp_path):
    publish(hub_api, "timm-like/pickled", {"pytorch_model.bin": b"\x80\x02 not loaded"})
    with pytest.raises(ConfigError, match="only a pickle checkpoint .pytorch_model.bin."):
        pretrained.load("timm-like/pickled", "resnet18-in", WIDTH)
    saved = tmp_path / "weights.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, saved)
    with pytest.raises(ConfigError, match="is a pickle checkpoint"):
        pretrained.load(str(saved), "resnet18-in", WIDTH)
    disguised = tmp_path / "model.safetensors"  # a torch.save file under a safetensors name
    disguised.write_bytes(saved.read_bytes())
    with pytest.raises(ConfigError, match="is a pickle checkpoint"):
        pretrained.load(str(disguised), "resnet18-in", WIDTH)


def test_a_file_that_is_not_safetensors_is_refused(hub_api):
    publish(hub_api, REPO, {"model.safetensors": b"{\"not\": \"safetensors\"}"})
    with pytest.raises(ConfigError, match="is not a safetensors file"):
        pretrained.load(REPO, "resnet18-in", WIDTH)


def test_a_wrong_hash_is_refused_and_evicted_from_the_cache(hub_api):
    publish(hub_api, REPO, {"model.safetensors": save(timm_checkpoint())})
    with pytest.raises(ConfigError, match="--pretrained-sha256"):
        pretrained.load(REPO, "resnet18-in", WIDTH, sha256="0" * 64)
    right = pretrained.load(REPO, "resnet18-in", WIDTH).record["sha256"]
    assert pretrained.load(REPO, "resnet18-in", WIDTH, sha256=right.upper()).record["sha256"] == right


def test_unknown_repository_or_revision(hub_api):
    publish(hub_api, REPO, {"model.safetensors": save(timm_checkpoint())})
    with pytest.raises(ExportError, match="No model repository"):
        pretrained.load("timm-like/absent", "resnet18-in", WIDTH)
    with pytest.raises(ExportError, match="no revision 'v9'"):
        pretrained.load(f"{REPO}@v9", "resnet18-in", WIDTH)


def test_the_cli_refuses_in_one_sentence_before_reading_any_data(hub_api, tmp_path):
    publish(hub_api, "timm-like/pickled", {"pytorch_model.bin": b"\x80\x02"})
    out = tmp_path / "never"
    data = tmp_path / "photos"  # an image that does not decode: had the data been read, that would be the error
    for name in ("a", "b"):
        (data / name).mkdir(parents=True)
        (data / name / "0.png").write_bytes(b"not an image")
    result = CliRunner().invoke(app, ["train", str(data), "--arch", "resnet18-in",
                                      "--pretrained", "timm-like/pickled", "--out", str(out)])
    assert result.exit_code != 0
    assert "pickle checkpoint" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_cached_backbone_is_used_when_the_hub_does_not_answer(hub_api, fake_hub: FakeHub, tmp_path):
    """Without HF_HUB_OFFLINE: the Hub fetched once, then gone (nothing listening), the cache answers."""
    publish(hub_api, REPO, {"model.safetensors": save(timm_checkpoint())})
    record = pretrained.load(REPO, "resnet18-in", WIDTH).record
    fake_hub.stop()
    assert pretrained.load(REPO, "resnet18-in", WIDTH).record["commit"] == record["commit"]
    with pytest.raises(ExportError, match=r"hf download timm/other model.safetensors --revision main"):
        pretrained.load("timm/other", "resnet18-in", WIDTH)  # never fetched: the sentence says how to fill the cache
