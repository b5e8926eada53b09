"""Build a zoo entry that `sb pull NAME --data FILE` learns on the user's machine, and print its index table.

The subset (the first N training and test images of each class, file-name order) is written by
``sbcli.data.subset``, the class order is drawn as `sb train` draws it (``--order-seed``), and the learner is
learned by the entry's recipe exactly as the pull will learn it. Printed: the ``[entries.NAME]`` TOML with the
subset's SHA-256, the SHA-256 of every file of the learner, the metrics of its own history and the build's
seconds. Paste it into zoo/index.toml, then check a pull reproduces it:

    PYTHONPATH=. python benchmarks/zoo_entry.py cifar10-lite0-ridge-5 --data DIR/cifar10-jpeg.zip --tasks 5 \
        --per-class 100 --test-per-class 50 --out /tmp/c10
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sbcli.config.options import build_options
from sbcli.data.scenario import class_order
from sbcli.data.subset import SubsetSpec, _listing, _Reader, write_subset
from sbcli.hub.zoo import sha256_file
from sbcli.metrics import history_summary
from sbcli.run.sequence import train
from sbcli.run.zoo_build import KEEP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--per-class", type=int, required=True)
    parser.add_argument("--test-per-class", type=int, required=True)
    parser.add_argument("--recipe", default="efficientnet-lite0-ridge")
    parser.add_argument("--order-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    reader = _Reader(args.data)
    names = sorted(_listing(reader)["train"])
    reader.close()
    order = [names[i] for i in class_order(len(names), args.order_seed)]
    per_task = len(names) // args.tasks
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sbcli-zoo-") as folder:
        subset = write_subset(args.data, SubsetSpec(names, args.per_class, args.test_per_class), Path(folder))
        seq, run, _ = build_options({"recipe": args.recipe, "source": str(subset.train), "test": str(subset.test),
                                     "base": per_task, "increment": per_task, "dataset_name": args.name,
                                     "class_order": [names.index(c) for c in order]})
        learner = train(seq, run, args.out, keep=KEEP)
    seconds = time.perf_counter() - start
    history = learner.state.history
    files = {}
    for rel in sorted(p.relative_to(args.out).as_posix() for p in args.out.rglob("*") if p.is_file()):
        if not rel.startswith(".") and rel not in ("accuracy.png", "history.csv"):
            files[rel] = sha256_file(args.out / rel)
    summary = history_summary(history)
    metrics = {"accuracy_per_step": [round(h.metrics.overall, 2) for h in history],
               "avg_incremental_1_to_T": round(summary.avg_incremental_1_to_T, 2), "last": round(summary.last, 2),
               "forgetting": round(summary.forgetting, 2), "test_images": subset.images - args.per_class * len(names),
               "train_images": args.per_class * len(names), "build_seconds": round(seconds, 1)}
    print(json.dumps({"name": args.name, "subset_sha256": subset.sha256, "class_order": order, "metrics": metrics,
                      "files": files, "seconds": seconds}))


if __name__ == "__main__":
    main()
