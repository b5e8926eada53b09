"""Task sequences on a real ImageNet backbone: EfficientNet-Lite0 (``--pretrained efficientnet-lite0``) at 224 px.

The backbone's pooled features of every image are computed ONCE (sbcli's own loader, resize, normalisation and
feature pass, on the learner ``sb pull efficientnet-lite0-ridge`` makes), then every head reads them:

* ``ranpac``: sbcli's ridge head (``sbcli.methods.ranpac.fit_step``: ``--projection``, by default 0 as ``sb train
  --pretrained efficientnet-lite0`` takes it; ridge chosen on held-back images at every step), exactly the numbers
  ``sb add-task`` computes, step after step;
* ``simplecil``: sbcli's class prototypes (``sbcli.methods.simplecil.class_prototypes``), nearest by cosine;
* ``joint``: the bound, one multinomial logistic-regression probe (L-BFGS, L2) on every seen class's training
  features at once, refit at each step.

Then the real path is timed: ``api.train`` learns task 1 and ``api.add_task`` (what ``sb add-task`` runs) task 2,
for ranpac and simplecil, from an empty cache: ``add_task_s`` and the training images a second it made.
``--finetune-epochs E`` instead runs STD + WA fine-tuned from the same backbone (``--method std --pretrained
efficientnet-lite0``, E epochs a step) over the same tasks, and ``--scratch-only`` the folder's run from scratch
(``--pretrained none``).

The data: a zip of class-per-folder images (``cifar10-jpeg.zip``: ``<top>/train|test/<class>/*``) or the official
Tiny-ImageNet layout (``tiny-imagenet-100.zip``: ``train/<wnid>/images``, ``val/images`` + ``val_annotations.txt``).
``--per-class`` / ``--test-per-class`` take the first N images of a class in file-name order (0: every image).
The features come from what ``sb add-task`` of a frozen backbone runs (:func:`sbcli.run.add_task.stream_features`:
decoded in batches on a thread pool, the backbone's pass on onnxruntime where it agrees with PyTorch's float32);
``--features FILE`` keeps them in a safetensors file and reads them from there next time
(``benchmarks/closed_form_heads.py --features FILE`` reads the same file). One JSON line on stdout, then the table:

    PYTHONPATH=. python benchmarks/efficientnet_lite.py --data DIR/cifar10-jpeg.zip --tasks 5 --per-class 20 --test-per-class 20
    PYTHONPATH=. python benchmarks/efficientnet_lite.py --data DIR/tiny-imagenet-100.zip --tasks 10 --per-class 5 --test-per-class 5
    PYTHONPATH=. python benchmarks/efficientnet_lite.py --data DIR/cifar10-jpeg.zip --tasks 5 --per-class 0 --test-per-class 0 --features c10.safetensors
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import torch


def write_subset(archive: Path, root: Path, per_class: int, test_per_class: int) -> tuple[Path, Path]:
    """``root/train/<class>/`` and ``root/test/<class>/`` with the first N images of each class (file-name order)."""
    train: dict[str, list[str]] = defaultdict(list)
    test: dict[str, list[str]] = defaultdict(list)
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        notes = [n for n in names if n.endswith("val/val_annotations.txt")]
        if notes:  # the official Tiny-ImageNet layout
            top = notes[0].rsplit("val/", 1)[0]
            for n in names:
                parts = n[len(top):].split("/")
                if len(parts) == 4 and parts[0] == "train" and parts[2] == "images" and parts[3]:
                    train[parts[1]].append(n)
            for line in z.read(notes[0]).decode().splitlines():
                if line.strip():
                    file, wnid = line.split("\t")[:2]
                    test[wnid].append(f"{top}val/images/{file}")
        else:
            for n in names:
                parts = n.split("/")
                if len(parts) == 4 and parts[3]:
                    (train if parts[1] == "train" else test)[parts[2]].append(n)
        for split, table, count in (("train", train, per_class), ("test", test, test_per_class)):
            for cls, files in table.items():
                (root / split / cls).mkdir(parents=True, exist_ok=True)
                for n in sorted(files)[:count or None]:  # 0: every image
                    (root / split / cls / Path(n).name).write_bytes(z.read(n))
    return root / "train", root / "test"


def joint_probe(train_f: torch.Tensor, train_y: torch.Tensor, test_f: torch.Tensor, classes: int, l2: float = 1e-3) -> torch.Tensor:
    """Predictions of a multinomial logistic regression fit on all of ``train_f`` at once (standardised, L-BFGS)."""
    mean, std = train_f.mean(0), train_f.std(0) + 1e-6
    x, t = (train_f - mean) / std, (test_f - mean) / std
    w = torch.zeros(x.shape[1], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, train_y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return (t @ w + b).argmax(1)


def heads_over_steps(feats: dict, order: list[int], tasks: int, seed: int, projection: int = 0) -> dict[str, list[float]]:
    """Per-step top-1 (%) on the seen classes' test images of ranpac, simplecil and the joint probe."""
    from sbcli.methods.ranpac import Config, RidgeState, fit_step, project
    from sbcli.methods.simplecil import class_prototypes

    relabel = torch.full((max(order) + 1,), -1, dtype=torch.long)
    relabel[torch.tensor(order)] = torch.arange(len(order))
    tr_f, tr_y = feats["train"], relabel[feats["train_y"]]
    te_f, te_y = feats["test"], relabel[feats["test_y"]]
    per = len(order) // tasks
    state = RidgeState.start(tr_f.shape[1], Config(projection=projection), seed)
    protos = torch.zeros(0, tr_f.shape[1])
    curves: dict[str, list[float]] = {"ranpac": [], "simplecil": [], "joint": []}
    for step in range(tasks):
        lo, hi = step * per, (step + 1) * per
        new = (tr_y >= lo) & (tr_y < hi)
        state, head, _ = fit_step(state, tr_f[new], tr_y[new], hi, None, seed * 1000 + step + 1)
        protos = torch.cat([protos, class_prototypes(tr_f[new], tr_y[new], range(lo, hi))])
        seen = te_y < hi
        f, y = te_f[seen], te_y[seen]
        ridge_pred = (project(f, state.projection).float() @ head.T).argmax(1)
        proto_pred = (torch.nn.functional.normalize(f, dim=1) @ torch.nn.functional.normalize(protos, dim=1).T).argmax(1)
        old = tr_y < hi
        joint_pred = joint_probe(tr_f[old], tr_y[old], f, hi)
        for name, pred in (("ranpac", ridge_pred), ("simplecil", proto_pred), ("joint", joint_pred)):
            curves[name].append(round(100.0 * (pred == y).float().mean().item(), 2))
    return curves


def real_path(train: Path, test: Path, order: list[str], per_task: int, work: Path) -> dict[str, dict]:
    """Task 1 by ``api.train``, task 2 by ``api.add_task`` (timed), for ranpac and simplecil, on their own folders."""
    from sbcli import api

    out: dict[str, dict] = {}
    folders = task_folders(train, test, order, per_task, 2, work)
    for method in ("ranpac", "simplecil"):
        seq, run = api.options(str(folders[0, "train"]), test=str(folders[0, "test"]), pretrained="efficientnet-lite0",
                               method=method, tasks=1, order_seed=-1, device="cpu")
        api.train(seq, run, work / method)
        images = sum(1 for _ in folders[1, "train"].rglob("*.*"))
        start = time.perf_counter()
        summary = api.add_task(work / method, folders[1, "train"], folders[1, "test"], device="cpu")
        seconds = time.perf_counter() - start
        out[method] = {"add_task_s": round(seconds, 2), "train_images": images,
                       "images_per_s": round(images / seconds, 2), "accuracy": summary.metrics.overall}
    return out


def task_folders(train: Path, test: Path, order: list[str], per_task: int, tasks: int, work: Path) -> dict:
    """``work/taskT/train|test/<class>`` as links to the subset's images, in the class order of the heads."""
    folders = {}
    for t in range(tasks):
        for split, src in (("train", train), ("test", test)):
            dst = work / f"task{t}" / split
            for cls in order[t * per_task:(t + 1) * per_task]:
                (dst / cls).mkdir(parents=True, exist_ok=True)
                for f in (src / cls).iterdir():
                    (dst / cls / f.name).symlink_to(f)
            folders[t, split] = dst
    return folders


def trained_path(train: Path, test: Path, order: list[str], per_task: int, tasks: int, work: Path,
                 **options: object) -> dict:
    """A method that trains, over the same tasks: task 1 by ``api.train``, the others by ``api.add_task``; per-step
    accuracy and each add-task's seconds. With no options, `sb train FOLDER --pretrained none` (STD + WA from
    scratch, the folder default before EfficientNet-Lite0, its own resolution and epochs)."""
    from sbcli import api

    folders = task_folders(train, test, order, per_task, tasks, work / "folders")
    options = options or {"pretrained": "none"}
    seq, run = api.options(str(folders[0, "train"]), test=str(folders[0, "test"]), tasks=1, order_seed=-1, device="cpu",
                           **options)
    learner = api.train(seq, run, work / "trained")
    curve = [learner.state.history[-1].metrics.overall]
    seconds = []
    for t in range(1, tasks):
        start = time.perf_counter()
        summary = api.add_task(work / "trained", folders[t, "train"], folders[t, "test"], device="cpu")
        seconds.append(round(time.perf_counter() - start, 2))
        curve.append(summary.metrics.overall)
    images = sum(1 for _ in folders[1, "train"].rglob("*.*"))
    return {"method": f"{run.method}+{getattr(learner.state.method_config, 'inference', '')}", "image_size": learner.state.image_size,
            "epochs": run.train.epochs, "lr": run.train.lr, "batch": run.train.batch_size, "pretrained": run.pretrained, "curve": [round(a, 2) for a in curve],
            "add_task_s": seconds, "images_per_s": round(images / seconds[0], 2)}


def backbone_features(train: Path, test: Path, work: Path, saved: Path | None, threads: int) -> tuple[dict, list[str], float]:
    """The backbone's pooled features of every image of ``train`` and ``test`` by `sb add-task`'s own frozen pass,
    from ``saved`` where it holds them (the same images), else computed and kept there; and the seconds it took."""
    from safetensors.torch import load_file, save_file

    from sbcli import api
    from sbcli.data.stream import FolderStream
    from sbcli.engine.loop import Engine, TrainConfig
    from sbcli.learner.state import Learner
    from sbcli.run.add_task import stream_features

    if saved is not None and saved.is_file():
        meta = json.loads(saved.with_suffix(".json").read_text())
        return dict(load_file(str(saved))), meta["classes"], meta["seconds"]
    api.pull("efficientnet-lite0-ridge", work / "backbone")
    learner = Learner.load(work / "backbone", "cpu")
    engine = Engine(TrainConfig(threads=threads), torch.device("cpu"), learner.norm, 0)
    feats: dict[str, torch.Tensor] = {}
    start = time.perf_counter()
    for split, folder in (("train", train), ("test", test)):
        stream = FolderStream.scan(folder, learner.state.image_size)
        feats[split], _ = stream_features(stream, engine, learner.model)
        feats[f"{split}_y"] = stream.labels
        names = stream.class_names
    seconds = time.perf_counter() - start
    if saved is not None:
        save_file({k: v.contiguous() for k, v in feats.items()}, str(saved))
        saved.with_suffix(".json").write_text(json.dumps({"classes": names, "seconds": seconds,
                                                          "image_size": learner.state.image_size}))
    return feats, names, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--test-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--projection", type=int, default=0, help="the ridge head's random projection (0: none)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--features", type=Path, help="a safetensors file that keeps the features for the next run")
    parser.add_argument("--no-real-path", action="store_true", help="skip the timed api.train/api.add_task runs")
    parser.add_argument("--scratch-only", action="store_true",
                        help="only `sb train FOLDER --pretrained none` (STD + WA from scratch) over the same tasks")
    parser.add_argument("--finetune-epochs", type=int,
                        help="only STD + WA fine-tuned from EfficientNet-Lite0, this many epochs a step, over the same tasks")
    parser.add_argument("--finetune-lr", type=float, default=0.01, help="its learning rate (a pretrained backbone: low)")
    parser.add_argument("--finetune-batch", type=int, default=16, help="its batch size (a few images a class: small)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["SBCLI_CACHE"] = str(work / "cache")  # a first run: nothing decoded or cached before
        train, test = write_subset(args.data, work / "data", args.per_class, args.test_per_class)
        if args.scratch_only or args.finetune_epochs:
            names = sorted(p.name for p in train.iterdir())
            order = list(range(len(names)))
            random.Random(args.seed).shuffle(order)
            options = {} if args.scratch_only else {"pretrained": "efficientnet-lite0", "method": "std",
                                                    "epochs": args.finetune_epochs, "lr": args.finetune_lr,
                                                    "batch_size": args.finetune_batch}
            result = trained_path(train, test, [names[i] for i in order], len(names) // args.tasks, args.tasks, work,
                                  **options)
            print(json.dumps({"data": args.data.name, "tasks": args.tasks, "per_class": args.per_class,
                              "test_per_class": args.test_per_class, "seed": args.seed, "trained": result}))
            curve = result["curve"]
            start = "from scratch" if result["pretrained"] is None else f"fine-tuned from {result['pretrained']}"
            print(f"| {result['method']} {start} ({result['image_size']} px, {result['epochs']} epochs a step, lr {result['lr']}, batch {result['batch']}) | "
                  f"{' / '.join(f'{a:.1f}' for a in curve)} | {sum(curve) / len(curve):.1f} | {curve[-1]:.1f} | "
                  f"{result['add_task_s'][0]} | {result['images_per_s']} |")
            return
        feats, names, feature_s = backbone_features(train, test, work, args.features, args.threads)
        count = len(feats["train_y"]) + len(feats["test_y"])
        order = list(range(len(names)))
        random.Random(args.seed).shuffle(order)
        curves = heads_over_steps(feats, order, args.tasks, args.seed, args.projection)
        real = {} if args.no_real_path else real_path(train, test, [names[i] for i in order],
                                                        len(names) // args.tasks, work / "real")
    result = {"data": args.data.name, "classes": len(names), "tasks": args.tasks, "per_class": args.per_class,
              "test_per_class": args.test_per_class, "seed": args.seed, "projection": args.projection,
              "feature_images": count, "feature_s": round(feature_s, 1),
              "feature_images_per_s": round(count / feature_s, 2), "threads": args.threads,
              "curves": curves, "real_path": real}
    print(json.dumps(result))
    every = lambda n: "every" if n == 0 else str(n)  # noqa: E731
    print(f"\n{args.data.name}: {len(names)} classes in {args.tasks} tasks, {every(args.per_class)} train / "
          f"{every(args.test_per_class)} test images a class, seed {args.seed}, projection {args.projection}\n")
    print("| method | per-step top-1 (%) | average | last | add-task s (task 2) | images/s |")
    print("|---|---|---|---|---|---|")
    for name, curve in curves.items():
        r = real.get(name, {})
        print(f"| {name} | {' / '.join(f'{a:.1f}' for a in curve)} | {sum(curve) / len(curve):.1f} | {curve[-1]:.1f} | "
              f"{r.get('add_task_s', '-')} | {r.get('images_per_s', '-')} |")
    print(f"\nfeatures: {count} images in {feature_s:.1f} s ({count / feature_s:.2f} images/s, {args.threads} threads)")


if __name__ == "__main__":
    main()
