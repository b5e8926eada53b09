"""Tests of the data sources: class-per-folder, CIFAR, Tiny-ImageNet, the demo and the cache."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, features
from realdata import archive_path

from sbcli import data as data_package
from sbcli.data.imageset import ImageSet
from sbcli.data.sources import (
    DecodeCache,
    FolderReport,
    decode,
    load_cifar,
    load_demo,
    load_folder,
    load_tiny_imagenet,
)
from sbcli.errors import ConfigError, DataError, UnknownNameError

REAL_TINY = archive_path("tiny-imagenet-100.zip")


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def solid(mode: str, size: tuple[int, int], color: object) -> Image.Image:
    """A one-colour image."""
    return Image.new(mode, size, color)


def save(image: Image.Image, path: Path, **kwargs: object) -> Path:
    """Save ``image`` to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kwargs)
    return path


def jpeg_bytes(color: tuple[int, int, int], size: int = 64) -> bytes:
    """A solid-colour JPEG."""
    buffer = io.BytesIO()
    solid("RGB", (size, size), color).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


@pytest.fixture
def photo_tree(tmp_path: Path) -> Path:
    """A class-per-folder tree in many formats, modes and sizes, with some non-image files."""
    root = tmp_path / "train"
    palette = solid("RGB", (20, 10), (0, 0, 255)).convert("P")
    save(solid("RGB", (40, 30), (255, 0, 0)), root / "cat" / "a.png")
    save(solid("L", (50, 50), 100), root / "cat" / "b.jpg", quality=95)
    save(solid("RGBA", (8, 8), (0, 255, 0, 128)), root / "cat" / "c.bmp")
    save(palette, root / "dog" / "a.gif")
    save(palette, root / "dog" / "b.png", transparency=0)
    save(solid("RGBA", (33, 17), (10, 20, 30, 0)), root / "dog" / "nested" / "c.PNG")
    save(Image.fromarray(np.full((9, 9), 65535, dtype=np.uint16)), root / "dog" / "d16.png")
    save(solid("RGB", (32, 32), (1, 2, 3)), root / "ant" / "only.tiff")
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "cat" / ".DS_Store").write_bytes(b"\0\0")
    (root / "README.md").write_text("beside the class folders")
    (root / ".hidden").mkdir()
    save(solid("RGB", (4, 4), 0), root / ".hidden" / "x.png")
    return root


# --------------------------------------------------------------------------------------------
# Class-per-folder
# --------------------------------------------------------------------------------------------


def test_folder_loads_every_mode_and_size(photo_tree: Path) -> None:
    report = load_folder(photo_tree, 16, cache=None)
    assert isinstance(report, FolderReport)
    data = report.data
    assert data.class_names == ["ant", "cat", "dog"]
    assert data.images.shape == (8, 3, 16, 16) and data.images.dtype == torch.uint8
    assert data.labels.tolist() == [0, 1, 1, 1, 2, 2, 2, 2]
    assert data.labels.dtype == torch.int64
    assert report.skipped == 3
    assert set(report.skipped_examples) == {"README.md", "cat/.DS_Store", "dog/notes.txt"}


def test_folder_converts_colours(photo_tree: Path) -> None:
    images = load_folder(photo_tree, 8, cache=None).data.images
    pixel = images[:, :, 4, 4].tolist()
    assert pixel[0] == [1, 2, 3]  # ant/only.tiff
    assert pixel[1] == [255, 0, 0]  # cat/a.png
    assert all(abs(v - 100) <= 2 for v in pixel[2])  # cat/b.jpg, grayscale JPEG
    assert pixel[3] == [0, 255, 0]  # cat/c.bmp, alpha dropped
    assert pixel[4] == [0, 0, 255] and pixel[5] == [0, 0, 255]  # palette GIF and PNG
    assert pixel[6] == [255, 255, 255]  # 16-bit PNG scaled, not clipped
    assert pixel[7] == [10, 20, 30]  # nested RGBA, fully transparent


@pytest.mark.skipif(not features.check("webp"), reason="this Pillow build has no WebP support")
def test_folder_reads_webp(tmp_path: Path) -> None:
    save(solid("RGB", (70, 20), (0, 128, 0)), tmp_path / "x" / "a.webp", lossless=True)
    data = load_folder(tmp_path, 32, cache=None).data
    assert data.images.shape == (1, 3, 32, 32)
    assert data.images[0, :, 10, 10].tolist() == [0, 128, 0]


def test_folder_applies_exif_rotation_and_shrinks_big_photos(tmp_path: Path) -> None:
    """A phone photo: 2000x1000 pixels stored sideways with an EXIF orientation tag."""
    photo = solid("RGB", (2000, 1000), (255, 0, 0))
    photo.paste((0, 0, 255), (1000, 0, 2000, 1000))  # left half red, right half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display": the left half ends up on top
    save(photo, tmp_path / "cls" / "photo.jpg", exif=exif, quality=95)
    image = load_folder(tmp_path, 16, cache=None).data.images[0]
    assert image[:, 2, 8].tolist()[0] > 200 and image[:, 2, 8].tolist()[2] < 50  # top: red
    assert image[:, 13, 8].tolist()[2] > 200 and image[:, 13, 8].tolist()[0] < 50  # bottom: blue


def test_folder_rejects_a_non_positive_size(photo_tree: Path) -> None:
    with pytest.raises(ConfigError, match="at least 1 pixel"):
        load_folder(photo_tree, 0, cache=None)


def test_folder_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_folder(tmp_path / "nope", 32, cache=None)


def test_folder_is_a_file(tmp_path: Path) -> None:
    path = save(solid("RGB", (4, 4), 0), tmp_path / "a.png")
    with pytest.raises(DataError, match="not a folder"):
        load_folder(path, 32, cache=None)


@pytest.mark.parametrize("with_loose_image", [False, True])
def test_folder_without_class_folders(tmp_path: Path, with_loose_image: bool) -> None:
    if with_loose_image:
        save(solid("RGB", (4, 4), 0), tmp_path / "a.png")
    with pytest.raises(DataError, match="No class folders in"):
        load_folder(tmp_path, 32, cache=None)


def test_folder_class_without_images(tmp_path: Path) -> None:
    save(solid("RGB", (4, 4), 0), tmp_path / "cat" / "a.png")
    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "list.csv").write_text("a,b")
    with pytest.raises(DataError) as info:
        load_folder(tmp_path, 32, cache=None)
    assert (
        str(info.value) == f"No images found in {tmp_path / 'dog'}; put at least one image file in each class folder."
    )


@pytest.mark.parametrize("content", [b"this is not a jpeg", jpeg_bytes((9, 9, 9))[:200]], ids=["garbage", "truncated"])
def test_folder_undecodable_image_names_the_file(tmp_path: Path, content: bytes) -> None:
    save(solid("RGB", (4, 4), 0), tmp_path / "cat" / "a.png")
    bad = tmp_path / "dog" / "broken.jpg"
    bad.parent.mkdir()
    bad.write_bytes(content)
    with pytest.raises(DataError, match="Cannot decode image") as info:
        load_folder(tmp_path, 32, cache=None)
    assert str(bad) in str(info.value)


def test_folder_many_images_keep_their_order(tmp_path: Path) -> None:
    """More images than one thread-pool chunk land in the right rows."""
    for i in range(300):
        save(solid("L", (6, 6), i % 256), tmp_path / ("a" if i < 150 else "b") / f"{i:03d}.png")
    data = load_folder(tmp_path, 4, cache=None).data
    assert data.images[:, 0, 0, 0].tolist() == [i % 256 for i in range(300)]
    assert data.labels.tolist() == [0] * 150 + [1] * 150


# --------------------------------------------------------------------------------------------
# CIFAR in torchvision's on-disk format
# --------------------------------------------------------------------------------------------


def write_pickle(path: Path, obj: object) -> None:
    """Pickle like the official files: protocol 2, str keys, numpy data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def fake_batch(count: int, num_classes: int, seed: int, label_key: str) -> dict[str, object]:
    """A CIFAR batch dict with random pixels."""
    rng = np.random.default_rng(seed)
    return {
        "batch_label": f"batch {seed}",
        label_key: [int(v) for v in rng.integers(0, num_classes, count)],
        "data": rng.integers(0, 256, (count, 3072), dtype=np.uint8),
        "filenames": [f"img_{seed}_{i}.png" for i in range(count)],
    }


def write_cifar100(root: Path, train_count: int = 20, test_count: int = 10) -> Path:
    """A small cifar-100-python/ folder (train, test, meta)."""
    folder = root / "cifar-100-python"
    for file, count, seed in (("train", train_count, 1), ("test", test_count, 2)):
        batch = fake_batch(count, 100, seed, "fine_labels")
        batch["coarse_labels"] = [label // 5 for label in batch["fine_labels"]]
        write_pickle(folder / file, batch)
    fine = [f"class_{i:02d}" for i in range(100)]
    write_pickle(folder / "meta", {"fine_label_names": fine, "coarse_label_names": [f"super_{i}" for i in range(20)]})
    return folder


def write_cifar10(root: Path, per_batch: int = 4, splits: tuple[str, ...] = ("train", "test")) -> Path:
    """A small cifar-10-batches-py/ folder (data_batch_1..5, test_batch, batches.meta)."""
    folder = root / "cifar-10-batches-py"
    files = [f"data_batch_{i}" for i in range(1, 6)] if "train" in splits else []
    files += ["test_batch"] if "test" in splits else []
    for seed, file in enumerate(files):
        write_pickle(folder / file, fake_batch(per_batch, 10, seed, "labels"))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    write_pickle(folder / "batches.meta", {"label_names": names, "num_cases_per_batch": per_batch, "num_vis": 3072})
    return folder


def expected(folder: Path, files: list[str], label_key: str) -> tuple[torch.Tensor, list[int]]:
    """The images and labels the loader should return for ``files``."""
    batches = [pickle.loads((folder / f).read_bytes()) for f in files]
    images = np.concatenate([b["data"] for b in batches]).reshape(-1, 3, 32, 32)
    return torch.from_numpy(images), [label for b in batches for label in b[label_key]]


@pytest.mark.parametrize("train", [True, False])
def test_cifar100_unofficial_files_use_the_checked_reader(
    tmp_path: Path, train: bool, caplog: pytest.LogCaptureFixture
) -> None:
    folder = write_cifar100(tmp_path)
    with caplog.at_level(logging.WARNING, logger="sbcli.data.sources"):
        data = load_cifar(tmp_path, "cifar100", train, download=False)
    images, labels = expected(folder, ["train" if train else "test"], "fine_labels")
    assert torch.equal(data.images, images) and data.labels.tolist() == labels
    assert data.class_names == [f"class_{i:02d}" for i in range(100)]
    assert data.image_size == 32 and data.labels.dtype == torch.int64
    assert "differ from the official cifar100 release" in caplog.text


def test_cifar10_reads_all_five_batches(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path)
    data = load_cifar(tmp_path, "cifar10", True, download=False)
    images, labels = expected(folder, [f"data_batch_{i}" for i in range(1, 6)], "labels")
    assert len(data) == 20 and torch.equal(data.images, images) and data.labels.tolist() == labels
    assert data.class_names[0] == "airplane" and len(data.class_names) == 10


def test_cifar10_test_split_alone(tmp_path: Path) -> None:
    """torchvision's check covers both splits; the checked reader needs only the one asked for."""
    write_cifar10(tmp_path, splits=("test",))
    assert len(load_cifar(tmp_path / "cifar-10-batches-py", "cifar10", False, download=False)) == 4
    with pytest.raises(DataError, match="data_batch_1 is missing"):
        load_cifar(tmp_path, "cifar10", True, download=False)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_matching_md5_goes_through_torchvision(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Files whose md5 torchvision accepts are loaded by torchvision, with the same result."""
    from torchvision.datasets import CIFAR10, CIFAR100

    cls = CIFAR10 if name == "cifar10" else CIFAR100
    folder = write_cifar10(tmp_path) if name == "cifar10" else write_cifar100(tmp_path)
    checked = load_cifar(tmp_path, name, True, download=False)

    def md5(file: str) -> str:
        return hashlib.md5((folder / file).read_bytes()).hexdigest()

    monkeypatch.setattr(cls, "train_list", [[f, md5(f)] for f, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[f, md5(f)] for f, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(cls.meta["filename"])})
    caplog.clear()  # the first load warned; this one must not
    with caplog.at_level(logging.WARNING, logger="sbcli.data.sources"):
        official = load_cifar(tmp_path, name, True, download=False)
    assert caplog.text == ""
    assert torch.equal(official.images, checked.images) and torch.equal(official.labels, checked.labels)
    assert official.class_names == checked.class_names


def test_cifar_missing_says_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_cifar(tmp_path, "cifar100", True, download=False)
    message = str(info.value)
    assert str(tmp_path / "cifar-100-python" / "train") in message and "download=True" in message


def test_cifar_rejects_pickles_that_run_code(tmp_path: Path) -> None:
    folder = write_cifar100(tmp_path)
    (folder / "train").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(DataError, match="not a CIFAR pickle"):
        load_cifar(tmp_path, "cifar100", True, download=False)


def test_cifar_rejects_malformed_batches(tmp_path: Path) -> None:
    folder = write_cifar100(tmp_path)
    write_pickle(folder / "test", {"data": np.zeros((3, 100), np.uint8), "fine_labels": [0, 1, 2]})
    with pytest.raises(DataError, match="3072 values per image"):
        load_cifar(tmp_path, "cifar100", False, download=False)
    write_pickle(folder / "test", {"data": np.zeros((3, 3072), np.uint8), "fine_labels": [0, 1, 100]})
    with pytest.raises(DataError, match=r"one label in \[0, 100\)"):
        load_cifar(tmp_path, "cifar100", False, download=False)


def test_cifar_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="cifar100"):
        load_cifar(tmp_path, "cifar1000", True, download=False)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Tiny-ImageNet
# --------------------------------------------------------------------------------------------

TINY_WNIDS = ["n03", "n01", "n02"]  # not sorted on purpose: labels follow the sorted wnids
TINY_WORDS = {"n01": "goldfish, Carassius auratus", "n02": "dog, domestic dog", "n03": "dog", "n99": "unused"}
TINY_COLOURS = {"n01": (200, 0, 0), "n02": (0, 200, 0), "n03": (0, 0, 200)}


def tiny_files() -> dict[str, bytes]:
    """The files of a 3-class Tiny-ImageNet tree, by relative path."""
    files = {
        "wnids.txt": "\n".join(TINY_WNIDS).encode() + b"\n",
        "words.txt": "".join(f"{w}\t{n}\n" for w, n in TINY_WORDS.items()).encode(),
    }
    annotations = []
    for wnid in TINY_WNIDS:
        for i in range(3):
            files[f"train/{wnid}/images/{wnid}_{i}.JPEG"] = jpeg_bytes(TINY_COLOURS[wnid])
        files[f"train/{wnid}/{wnid}_boxes.txt"] = b"boxes\n"
    for i, wnid in enumerate(["n02", "n01", "n03", "n01"]):
        files[f"val/images/val_{i}.JPEG"] = jpeg_bytes(TINY_COLOURS[wnid], size=48)
        annotations.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t10\t10\n")
    files["val/val_annotations.txt"] = "".join(annotations).encode()
    return files


def write_tiny_dir(root: Path) -> Path:
    """The fake tree as a folder."""
    for rel, content in tiny_files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    return root


def write_tiny_zip(path: Path, prefix: str = "tiny-imagenet-200/") -> Path:
    """The fake tree as a zip, below ``prefix`` like the official archive."""
    with zipfile.ZipFile(path, "w") as archive:
        for rel, content in tiny_files().items():
            archive.writestr(prefix + rel, content)
    return path


def check_tiny(data_train: ImageSet, data_val: ImageSet) -> None:
    """The fake tree's content, whatever it was read from."""
    assert data_train.class_names == ["goldfish", "dog_n02", "dog_n03"]
    assert data_train.images.shape == (9, 3, 64, 64)
    assert data_train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert data_val.labels.tolist() == [1, 0, 2, 0]
    assert data_val.images.shape == (4, 3, 64, 64)  # 48 px val images resized to 64
    colours = [list(TINY_COLOURS[w]) for w in ["n02", "n01", "n03", "n01"]]
    for pixel, colour in zip(data_val.images[:, :, 32, 32].tolist(), colours, strict=True):
        assert all(abs(a - b) <= 3 for a, b in zip(pixel, colour, strict=True))


def test_tiny_imagenet_folder_parent_and_zip_agree(tmp_path: Path) -> None:
    folder = write_tiny_dir(tmp_path / "parent" / "tiny-imagenet-200")
    from_dir = [load_tiny_imagenet(folder, split, cache=None) for split in (True, False)]
    check_tiny(*from_dir)
    from_parent = load_tiny_imagenet(folder.parent, False, cache=None)
    assert torch.equal(from_parent.images, from_dir[1].images)
    for prefix in ("tiny-imagenet-200/", ""):
        archive = write_tiny_zip(tmp_path / f"tiny{len(prefix)}.zip", prefix)
        from_zip = [load_tiny_imagenet(archive, split, cache=None) for split in (True, False)]
        check_tiny(*from_zip)
        assert torch.equal(from_zip[0].images, from_dir[0].images)


def test_tiny_imagenet_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_tiny_imagenet(tmp_path / "missing.zip", True, cache=None)
    write_tiny_dir(tmp_path / "a")
    write_tiny_dir(tmp_path / "b")
    with pytest.raises(DataError, match="2 subfolders hold"):
        load_tiny_imagenet(tmp_path, True, cache=None)
    (tmp_path / "a" / "val" / "images" / "val_2.JPEG").unlink()
    with pytest.raises(DataError, match="val_2.JPEG, listed in"):
        load_tiny_imagenet(tmp_path / "a", False, cache=None)
    (tmp_path / "b" / "train" / "n02" / "images" / "n02_1.JPEG").write_bytes(b"nope")
    with pytest.raises(DataError, match="n02_1.JPEG"):
        load_tiny_imagenet(tmp_path / "b", True, cache=None)
    not_zip = tmp_path / "x.zip"
    not_zip.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable zip"):
        load_tiny_imagenet(not_zip, True, cache=None)


@pytest.mark.skipif(not REAL_TINY.is_file(), reason=f"real data absent: {REAL_TINY} (set SBCLI_TEST_DATA)")
def test_tiny_imagenet_real_subset() -> None:
    """All 55,000 JPEGs of the 100-class Tiny-ImageNet subset, straight from the zip (~12 s on 2 cores)."""
    val = load_tiny_imagenet(REAL_TINY, False, cache=None)
    assert val.images.shape == (5000, 3, 64, 64)
    assert len(val.class_names) == 100 == len(set(val.class_names))
    assert "goldfish" in val.class_names
    assert torch.bincount(val.labels).tolist() == [50] * 100
    train = load_tiny_imagenet(REAL_TINY, True, cache=None)
    assert train.images.shape == (50000, 3, 64, 64)
    assert torch.bincount(train.labels).tolist() == [500] * 100
    assert train.class_names == val.class_names
    assert 60 < float(train.images[::97].float().mean()) < 160  # real photos, not blank rows


# --------------------------------------------------------------------------------------------
# The embedded demo
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("train", "per_class"), [(True, 300), (False, 100)])
def test_demo(train: bool, per_class: int) -> None:
    data = load_demo(train)
    assert data.images.shape == (10 * per_class, 3, 32, 32) and data.images.dtype == torch.uint8
    assert data.class_names == [
        "tshirt_top",
        "trouser",
        "pullover",
        "dress",
        "coat",
        "sandal",
        "shirt",
        "sneaker",
        "bag",
        "ankle_boot",
    ]
    assert torch.bincount(data.labels).tolist() == [per_class] * 10
    assert torch.equal(data.images[:, 0], data.images[:, 2])  # grayscale in three channels
    assert int(data.images[:, :, :2].max()) == 0 and int(data.images[:, :, :, -2:].max()) == 0  # zero padding
    assert int(data.images.max()) == 255


def test_demo_file_is_small() -> None:
    path = Path(data_package.__file__).parent / "demo" / "fashion_mnist_demo.npz"
    assert path.stat().st_size < 3_000_000


# --------------------------------------------------------------------------------------------
# The decode cache
# --------------------------------------------------------------------------------------------


def refuse_to_decode(data: bytes, image_size: int, name: str = "image") -> np.ndarray:
    """Stands in for the decoder where the cache must answer."""
    raise AssertionError("decoded although the cache holds this data")


def test_cache_second_load_does_not_decode(photo_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = DecodeCache(tmp_path / "cache")
    first = load_folder(photo_tree, 16, cache=cache)
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 1
    assert not list((tmp_path / "cache").glob("*.tmp"))
    monkeypatch.setattr(decode, "decode_image", refuse_to_decode)
    second = load_folder(photo_tree, 16, cache=cache)
    assert torch.equal(first.data.images, second.data.images) and torch.equal(first.data.labels, second.data.labels)
    assert second.data.class_names == first.data.class_names
    assert (second.skipped, second.skipped_examples) == (first.skipped, first.skipped_examples)
    with pytest.raises(AssertionError, match="decoded although"):
        load_folder(photo_tree, 8, cache=cache)  # another size is another entry


def test_cache_misses_when_the_files_change(photo_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = DecodeCache(tmp_path / "cache")
    load_folder(photo_tree, 16, cache=cache)
    monkeypatch.setattr(decode, "decode_image", refuse_to_decode)
    target = photo_tree / "cat" / "a.png"
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(AssertionError, match="decoded although"):
        load_folder(photo_tree, 16, cache=cache)


@pytest.mark.parametrize("damage", ["truncate", "garble-json", "drop-json", "wrong-count"])
def test_cache_rebuilds_damaged_entries(photo_tree: Path, tmp_path: Path, damage: str) -> None:
    cache = DecodeCache(tmp_path / "cache")
    first = load_folder(photo_tree, 16, cache=cache)
    tensors = next((tmp_path / "cache").glob("*.safetensors"))
    meta = tensors.with_suffix(".json")
    if damage == "truncate":
        tensors.write_bytes(tensors.read_bytes()[:100])
    elif damage == "garble-json":
        meta.write_bytes(b"{\xff not json")
    elif damage == "drop-json":
        meta.unlink()
    else:
        meta.write_text(meta.read_text().replace('"count": 8', '"count": 7'))
    again = load_folder(photo_tree, 16, cache=cache)
    assert torch.equal(again.data.images, first.data.images)
    assert cache.get(tensors.stem) is not None  # rebuilt in place


def test_cache_for_tiny_imagenet_zip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = write_tiny_zip(tmp_path / "tiny.zip")
    cache = DecodeCache(tmp_path / "cache")
    first = load_tiny_imagenet(archive, False, cache=cache)
    monkeypatch.setattr(decode, "decode_image", refuse_to_decode)
    second = load_tiny_imagenet(archive, False, cache=cache)
    assert torch.equal(first.images, second.images) and second.class_names == first.class_names
    with pytest.raises(AssertionError, match="decoded although"):
        load_tiny_imagenet(archive, True, cache=cache)  # the other split is another entry


def test_cache_that_cannot_be_written_only_warns(
    photo_tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="sbcli.data.sources"):
        report = load_folder(photo_tree, 16, cache=DecodeCache(blocker / "cache"))
    assert len(report.data) == 8
    assert "Could not write the decode cache" in caplog.text


def test_cache_default_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SBCLI_CACHE", str(tmp_path / "c"))
    assert DecodeCache.default().directory == tmp_path / "c"
    monkeypatch.delenv("SBCLI_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert DecodeCache.default().directory == tmp_path / ".cache" / "sbcli" / "decoded"


def test_cache_key_covers_its_parts(tmp_path: Path) -> None:
    base = DecodeCache.key("folder", tmp_path, 32, "abc")
    assert len(base) == 64
    assert base == DecodeCache.key("folder", tmp_path / "." / "", 32, "abc")
    others = [
        DecodeCache.key("tiny-imagenet:val", tmp_path, 32, "abc"),
        DecodeCache.key("folder", tmp_path / "x", 32, "abc"),
        DecodeCache.key("folder", tmp_path, 64, "abc"),
        DecodeCache.key("folder", tmp_path, 32, "abd"),
    ]
    assert base not in others and len(set(others)) == 4
