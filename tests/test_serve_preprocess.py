"""The ONNX metadata alone defines the preprocessing: a from-scratch reader (Pillow + numpy, no
sbcli) that follows the `preprocess` key feeds the model exactly what `sb predict` feeds it, on
real Tiny-ImageNet JPEGs and on generated PNG, grayscale, RGBA, palette, 16-bit, EXIF-rotated and
odd-sized images. Older files (metadata format 1) keep their draft-mode decoding; unreadable or
newer metadata is one sentence."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from learners import make_learner
from PIL import Image, ImageOps
from realdata import archive_path, require_archive
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import ExportError
from sbcli.export import onnx as onnx_export
from sbcli.serve import preprocess
from sbcli.serve.classifier import open_onnx
from sbcli.serve.predict import predict

REAL_TINY = archive_path("tiny-imagenet-100.zip")
SIZE = 32  # the Tiny-ImageNet JPEGs are 64 px: every one is resized
REAL_COUNT = 200


def scratch_input(data: bytes, spec: dict) -> np.ndarray:
    """A third party's reading of the `preprocess` key, written from its description alone."""
    decode, resize = spec["decode"], spec["resize"]
    image = Image.open(io.BytesIO(data))
    if decode["jpeg_reduced_decode"]:
        image.draft(None, (resize["width"], resize["height"]))
    if decode["exif_orientation"] == "apply":
        image = ImageOps.exif_transpose(image)
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N") and decode["sixteen_bit"] == "divide_by_257":
        image = Image.fromarray(np.clip(np.asarray(image, dtype=np.float64) / 257, 0, 255).astype(np.uint8))
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    assert decode["mode"] == "RGB" and decode["alpha"] == "drop" and decode["gray"] == "replicate"
    image = image.convert("RGB")  # drops alpha, replicates gray
    size = (resize["width"], resize["height"])
    assert resize["keep_aspect_ratio"] is False and resize["reference"] == "Pillow Image.resize"
    if image.size != size:
        image = image.resize(size, getattr(Image.Resampling, resize["filter"].upper()))
    assert (spec["channel_order"], spec["layout"], spec["dtype"]) == ("RGB", "NCHW", "float32")
    return np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(spec["divide_by"])


def generated_images(folder: Path) -> list[Path]:
    """PNG, grayscale, RGBA, palette with transparency, 16-bit gray, EXIF-rotated JPEG, odd sizes."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)

    def pixels(h: int, w: int, c: int) -> np.ndarray:
        base = np.linspace(0, 255, h * w * c).reshape(h, w, c)  # smooth, so resizing matters
        return np.clip(base + rng.normal(0, 40, (h, w, c)), 0, 255).astype(np.uint8)

    made = {
        "rgb_same.png": Image.fromarray(pixels(SIZE, SIZE, 3)),
        "rgb_wide.png": Image.fromarray(pixels(28, 40, 3)),
        "rgb_small.png": Image.fromarray(pixels(9, 7, 3)),  # enlarged
        "gray.png": Image.fromarray(pixels(50, 50, 1)[..., 0]),
        "rgba.png": Image.fromarray(pixels(45, 45, 4)),
        "photo.jpg": Image.fromarray(pixels(300, 240, 3)),  # large enough for draft mode to matter
        "gray16.png": Image.fromarray(pixels(33, 33, 1)[..., 0].astype(np.uint16) * 250),
    }
    palette = Image.fromarray(pixels(40, 40, 3)).quantize(16)
    palette.info["transparency"] = 0
    made["palette.png"] = palette
    paths = []
    for name, image in made.items():
        paths.append(folder / name)
        image.save(paths[-1])
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    paths.append(folder / "rotated.jpg")
    Image.fromarray(pixels(48, 64, 3)).save(paths[-1], exif=exif)
    return paths


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights, and a head blind to the features' common direction: the top-1 varies by image."""
    import torch

    learner = make_learner("std", tasks=(5, 5), size=SIZE, seed=3)
    with torch.no_grad():
        net = learner.model.eval()
        norm = learner.norm
        x = torch.rand(64, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
        mean = net.forward_features((x - torch.tensor(norm.mean).view(1, 3, 1, 1)) / torch.tensor(norm.std).view(1, 3, 1, 1)).mean(0)
        mean = mean / mean.norm()
        weight = torch.randn(net.head.weight.shape, generator=torch.Generator().manual_seed(0))
        net.head.weight.copy_(weight - (weight @ mean)[:, None] * mean[None])
        net.head.bias.zero_()
    out = tmp_path_factory.mktemp("pre") / "model.onnx"
    onnx_export.export_onnx(learner, out)
    return out


def real_images(folder: Path) -> list[Path]:
    require_archive(REAL_TINY.name)
    with zipfile.ZipFile(REAL_TINY) as archive:
        names = sorted(n for n in archive.namelist() if "/val/images/" in n and n.endswith(".JPEG"))[:REAL_COUNT]
        folder.mkdir(parents=True)
        for name in names:
            (folder / Path(name).name).write_bytes(archive.read(name))
    return sorted(folder.iterdir())


def test_metadata_alone_reproduces_sb_predict(model: Path, tmp_path: Path) -> None:
    images = real_images(tmp_path / "real") + generated_images(tmp_path / "made")
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    spec, names = json.loads(meta["preprocess"]), json.loads(meta["class_names"])
    scratch = np.stack([scratch_input(p.read_bytes(), spec) for p in images])
    ours = open_onnx(model, "cpu").preprocess
    assert np.array_equal(scratch, ours.to_input([ours.decode(p.read_bytes()) for p in images]))  # bit for bit
    their_top1 = [names[i] for i in session.run(["logits"], {"images": scratch})[0].argmax(1)]
    res = CliRunner().invoke(app, ["predict", str(model), *map(str, images), "--json", "-k", "1", "--batch-size", "50"])
    assert res.exit_code == 0, res.output
    ours_top1 = [p["top"][0]["label"] for p in json.loads(res.stdout)["predictions"]]
    assert len(ours_top1) == REAL_COUNT + 9 and ours_top1 == their_top1  # 100 % agreement
    assert len(set(ours_top1)) >= 3  # the model's answers depend on the pixels
    # The decode key matters: decoding the whole JPEG (reduced decoding off) gives other inputs for the 64 px JPEGs.
    assert spec["decode"]["jpeg_reduced_decode"] is True
    whole = np.stack([scratch_input(p.read_bytes(), {**spec, "decode": {**spec["decode"], "jpeg_reduced_decode": False}})
                      for p in images[:REAL_COUNT]])
    assert (np.abs(whole - scratch[:REAL_COUNT]).reshape(REAL_COUNT, -1).max(1) > 0).mean() > 0.9


def test_training_and_serving_decode_the_same_pixels(model: Path, tmp_path: Path) -> None:
    """One decode function: what `sb serve`/`sb predict` feed an exported model is what training decoded."""
    from sbcli.data.sources import decode_image
    from sbcli.data.sources.folder import load_folder

    images = real_images(tmp_path / "real") + generated_images(tmp_path / "made")
    served = open_onnx(model, "cpu").preprocess
    for path in images:
        assert np.array_equal(served.decode(path.read_bytes()), decode_image(path.read_bytes(), SIZE)), path
    folder = tmp_path / "folder" / "only"
    folder.mkdir(parents=True)
    for path in images:
        (folder / path.name).write_bytes(path.read_bytes())
    trained = load_folder(tmp_path / "folder", SIZE, cache=None).data.images.numpy()
    ordered = sorted(images, key=lambda p: p.name)
    assert np.array_equal(trained, np.stack([served.decode(p.read_bytes()) for p in ordered]))


def with_metadata(model: Path, out: Path, change: dict[str, str | None]) -> Path:
    proto = onnx.load(str(model))
    props = {p.key: p.value for p in proto.metadata_props}
    for key, value in change.items():
        if value is None:
            props.pop(key, None)
        else:
            props[key] = value
    del proto.metadata_props[:]
    for key, value in props.items():
        proto.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    onnx.save_model(proto, str(out))
    return out


def test_format_1_files_keep_their_draft_mode_answers(model: Path, tmp_path: Path) -> None:
    """A file exported before format 2 (no `preprocess`, normalization with trailing text) is served as it was."""
    from sbcli.data.sources import decode_image  # the decoding sbcli used before format 2

    old = with_metadata(model, tmp_path / "old.onnx", {"preprocess": None, "sbcli_format": "1", "precision": None,
                                                       "normalization": '{"mean": [0.5], "std": [0.2]} (applied inside the graph)'})
    images = generated_images(tmp_path / "made")
    spec = open_onnx(old, "cpu").preprocess
    assert spec.jpeg_reduced_decode and (spec.width, spec.filter) == (SIZE, "bilinear")
    for path in images:
        assert np.array_equal(spec.decode(path.read_bytes()), decode_image(path.read_bytes(), SIZE))
    assert len(predict(old, images, top_k=1).predictions) == len(images)


def test_unreadable_or_newer_metadata_is_one_sentence(model: Path, tmp_path: Path) -> None:
    bad = with_metadata(model, tmp_path / "bad.onnx", {"preprocess": "{not json"})
    with pytest.raises(ExportError, match="'preprocess' metadata entry this sbcli cannot read"):
        open_onnx(bad)
    spec = json.loads(open_onnx(model).meta.raw["preprocess"])
    odd = with_metadata(model, tmp_path / "odd.onnx", {"preprocess": json.dumps({**spec, "channel_order": "BGR"})})
    with pytest.raises(ExportError, match="preprocessing this sbcli does not implement"):
        open_onnx(odd)
    newer = with_metadata(model, tmp_path / "new.onnx", {"sbcli_format": "9"})
    res = CliRunner().invoke(app, ["predict", str(newer), str(generated_images(tmp_path / "made")[0])])
    assert res.exit_code == 1 and "written by a newer sbcli (metadata format 9)" in res.output


def test_image_extensions_match_the_training_loader() -> None:
    from sbcli.data.sources import IMAGE_EXTENSIONS

    assert preprocess.IMAGE_EXTENSIONS == IMAGE_EXTENSIONS
