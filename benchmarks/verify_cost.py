"""What checking a learner's recorded SHA-256 hashes costs at load, on a full-width ResNet-18 learner.

Builds one learner (ResNet-18 at width 1.0, 32-pixel input, the 10 classes and state of the bundled
``demo-sb-tiny`` zoo learner, a memory of ``--exemplars`` random exemplars), saves it (format 3:
every file's hash recorded), and a copy whose ``learner.json`` records no hashes (format 2, read
without checking them). Then, in alternating rounds, times ``Learner.load`` of each, and SHA-256
over the same files alone. Prints one JSON object: file sizes, the median seconds of each, and the
difference (what verification adds to a load).

Example (the figure in docs/learner-format.md)::

    python benchmarks/verify_cost.py --rounds 7 --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sbcli.learner.state import Learner, LearnerState
from sbcli.methods.memory import ExemplarMemory
from sbcli.nets import create_model

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "zoo" / "learners" / "demo-sb-tiny"


def build(folder: Path, exemplars: int) -> Path:
    data = json.loads((ZOO / "learner.json").read_text(encoding="utf-8"))
    state = LearnerState.from_json({**data, "width": 1.0, "image_size": 32, "format_version": 3,
                                    "memory": {**data["memory"], "budget": exemplars}})
    model = create_model(state.arch, state.num_classes, state.width)
    memory = ExemplarMemory(state.memory.budget, state.memory.selection, state.memory.seed)
    gen = torch.Generator().manual_seed(0)
    memory.images = torch.randint(0, 256, (exemplars, 3, 32, 32), dtype=torch.uint8, generator=gen)
    memory.labels = torch.arange(exemplars) % state.num_classes
    learner = folder / "hashed"
    Learner(state, model, memory).save(learner)
    return learner


def unhashed_copy(learner: Path, folder: Path) -> Path:
    import shutil

    plain = folder / "plain"
    shutil.copytree(learner, plain)
    data = json.loads((plain / "learner.json").read_text(encoding="utf-8"))
    del data["hashes"]
    data["format_version"] = 2
    (plain / "learner.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    return plain


def sha_only(learner: Path) -> None:
    data = json.loads((learner / "learner.json").read_text(encoding="utf-8"))
    for rel in data["files"].values():
        hashlib.sha256((learner / rel).read_bytes()).hexdigest()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--exemplars", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        hashed = build(Path(tmp), args.exemplars)
        plain = unhashed_copy(hashed, Path(tmp))
        Learner.load(hashed), Learner.load(plain)  # warm: imports, page cache
        times: dict[str, list[float]] = {"load_verified": [], "load_unverified": [], "sha256_only": []}
        for _ in range(args.rounds):
            times["load_verified"].append(timed(lambda: Learner.load(hashed)))
            times["load_unverified"].append(timed(lambda: Learner.load(plain)))
            times["sha256_only"].append(timed(lambda: sha_only(hashed)))
        sizes = {rel: (hashed / rel).stat().st_size
                 for rel in json.loads((hashed / "learner.json").read_text())["files"].values()}
    med = {k: round(statistics.median(v), 4) for k, v in times.items()}
    print(json.dumps({"files_bytes": sizes, "total_mb": round(sum(sizes.values()) / 2**20, 1),
                      "rounds": args.rounds, "threads": args.threads, "median_s": med,
                      "verification_adds_s": round(med["load_verified"] - med["load_unverified"], 4),
                      "sha256_mb_per_s": round(sum(sizes.values()) / 2**20 / med["sha256_only"], 1)}, indent=2))


if __name__ == "__main__":
    main()
