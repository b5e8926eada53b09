"""The data of the GPU benchmarks: the 32 px Tiny-ImageNet-100 archive, its subsets, and a checkout's weight.

The archive (``tiny-imagenet-100-32px.zip``, class-per-folder WebP) is given to the check with ``--data``
(docs/lab/performance.md, "On a GPU"); the own-data runs read it and a CIFAR-10 subset from one folder
(``.gpu-data/`` of the checkout by default, an ignored folder). Where the checkout is copied to the GPU
machine, :func:`copy_size` says beforehand what the copy weighs and, given a limit, whether it fits.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

DATA_NAME = "tiny-imagenet-100-32px"


def unzip(archive: Path, dest: Path) -> Path:
    """Unpack a class-per-folder archive under ``dest`` once (a READY file marks it done); its top folder."""
    with zipfile.ZipFile(archive) as zf:
        top = dest / zf.namelist()[0].split("/")[0]
        if not (top / "READY").is_file():
            zf.extractall(dest)
            (top / "READY").write_text("ok\n")
    return top


def unpack(archive: Path, dest: Path) -> tuple[Path, Path]:
    """Unzip the class-per-folder archive once; returns its ``train`` and ``test`` folders."""
    root = unzip(archive, dest)
    return root / "train", root / "test"


def write_tiny_archive(path: Path, classes: int = 6, train: int = 12, test: int = 4, size: int = 32,
                       name: str = DATA_NAME, image_format: str = "WEBP") -> Path:
    """A small archive in the layout of the real one (WebP, class-per-folder), for dry runs and tests."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/words.txt", "".join(f"n{c:08d}\tclass {c}\n" for c in range(classes)))
        for c in range(classes):
            colour = rng.integers(30, 226, 3)
            for split, count in (("train", train), ("test", test)):
                for i in range(count):
                    pixels = np.clip(colour + rng.normal(0, 30, (size, size, 3)), 0, 255).astype(np.uint8)
                    buf = io.BytesIO()
                    Image.fromarray(pixels).save(buf, format=image_format, quality=90)
                    zf.writestr(f"{name}/{split}/n{c:08d}/{i}.{image_format.lower()}", buf.getvalue())
    return path


def copy_size(repo: Path, extra: list[str], max_mib: float | None = None) -> dict:
    """What copying the checkout weighs: its tracked and untracked-not-ignored files, plus the ignored
    paths ``extra`` that go with it (``.gpu-data``, ``.whl``), in MiB; ``fits``: at most ``max_mib``
    (always, without a limit)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, capture_output=True,
                            check=True).stdout.decode().split("\0")
    tree = sum((repo / f).stat().st_size for f in listed if f and (repo / f).is_file())
    carried = {c: sum(p.stat().st_size for p in (repo / c).rglob("*") if p.is_file()) if (repo / c).is_dir()
               else ((repo / c).stat().st_size if (repo / c).is_file() else 0) for c in extra}
    total = tree + sum(carried.values())
    return {"tree_mib": round(tree / 2**20, 1), "carried_mib": {k: round(v / 2**20, 1) for k, v in carried.items()},
            "total_mib": round(total / 2**20, 1), "limit_mib": max_mib,
            "fits": max_mib is None or total <= max_mib * 2**20}



def write_subset(archive: Path, dest: Path, train_per_class: int | None, test_per_class: int | None = None) -> Path:
    """A class-per-folder archive of ``archive``'s first ``train_per_class`` training (and
    ``test_per_class`` test) files of every class, in file-name order, its bytes as they are.

    For the own-data GPU runs: CIFAR-10 at "a few hundred photos a class" (500), a user's photo collection
    in size, beside the 32 px Tiny-ImageNet-100 archive.
    """
    limits = {"train": train_per_class, "test": test_per_class}
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as out:
        by_class: dict[tuple[str, str], list[str]] = {}
        for name in src.namelist():
            parts = name.split("/")
            if len(parts) == 4 and parts[1] in limits and parts[3]:
                by_class.setdefault((parts[1], parts[2]), []).append(name)
        for (split, _), names in sorted(by_class.items()):
            for name in sorted(names)[: limits[split]]:
                out.writestr(name, src.read(name))
    return dest
