"""How fast a class-per-folder source is read: files a second for listing, and for listing plus decoding.

Usage::

    nice -n 10 python benchmarks/folder_scan.py                       # 50,000 16 px PNGs in 10 classes
    nice -n 10 python benchmarks/folder_scan.py --folder data/train   # an existing folder (nothing written)

Without ``--folder`` it writes ``--images`` small PNGs (16 x 16, random colours around a colour
per class) into a temporary folder, one subfolder per class, and removes them at the end. It then
times, in this process: listing the folder (the class folders, every file's stat, the fingerprint
that keys the decode cache), and a whole load without the decode cache (listing, then decoding
every image on the thread pool at ``--image-size``), and prints files a second for each.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def write_images(root: Path, count: int, classes: int, side: int = 16) -> None:
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class_{c:02d}"
        folder.mkdir(parents=True)
        base = rng.integers(0, 256, 3)
        for i in range(count // classes):
            pixels = np.clip(base + rng.normal(0, 30, (side, side, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:05d}.png")


def measure(root: Path, image_size: int) -> dict[str, float]:
    from sbcli.data.sources.folder import _scan_folder, load_folder

    start = time.perf_counter()
    listing = _scan_folder(root)
    listed = time.perf_counter() - start
    start = time.perf_counter()
    report = load_folder(root, image_size, cache=None)
    loaded = time.perf_counter() - start
    return {"files": len(listing.files), "list_s": listed, "list_files_per_s": len(listing.files) / listed,
            "load_s": loaded, "load_files_per_s": len(report.data) / loaded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="an existing class-per-folder tree (default: write one)")
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--progress", action="store_true", help="show the progress lines on stderr")
    args = parser.parse_args()
    if args.progress:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.folder
        if root is None:
            root = Path(tmp) / "train"
            write_images(root, args.images, args.classes)
        out = measure(root, args.image_size)
    print(f"{out['files']:,} files: listed in {out['list_s']:.2f} s ({out['list_files_per_s']:,.0f} files/s); "
          f"listed and decoded at {args.image_size} px in {out['load_s']:.2f} s ({out['load_files_per_s']:,.0f} files/s)")


if __name__ == "__main__":
    main()
