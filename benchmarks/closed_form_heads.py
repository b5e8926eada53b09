"""Closed-form heads on one frozen backbone, side by side: the ridge head and the shared-covariance LDA head
(``--method ranpac --inference ridge|lda``), each with and without a random projection, and SimpleCIL's
prototypes, with the accuracy and the calibration after every step.

The backbone's features of every image are computed once; every head is then grown from them task by
task with sbcli's own step functions (``sbcli.methods.ranpac.fit_step``, ``sbcli.methods.simplecil``), so
a row is what ``sb add-task`` would give, without the files. After each step it prints the top-1 accuracy
over every class seen, the expected calibration error (15 equal-width bins of the top-class probability)
and the mean top-class probability.

The backbone is ``--pretrained REF`` (anything ``sb train --pretrained`` takes: an sbcli learner, a
``.safetensors`` file, a Hub repository; with ``--arch``/``--width`` for the latter two), or, without it,
the self-trained one of ``benchmarks/pretrained_path.py`` (ResNet-18 x0.25 trained by sbcli on 50 classes of
the 32 px Tiny-ImageNet-100 given as ``--data``), built on first use. It grows on ``--grow``:

* ``tiny``: the other 50 classes of ``--data`` in ``--tasks`` tasks (10 by default), 200 training images a class;
* a class-per-folder zip (``<top>/train/<class>/*``, ``<top>/test/<class>/*``; CIFAR-10 as JPEGs) in
  ``--tasks`` tasks, ``--per-class`` training images a class, every test image.

    PYTHONPATH=. python benchmarks/closed_form_heads.py --data DIR/tiny-imagenet-100-32px.zip --grow tiny > heads.jsonl
    PYTHONPATH=. python benchmarks/closed_form_heads.py --data DIR/tiny-imagenet-100-32px.zip --grow DIR/cifar10-jpeg.zip --tasks 5 >> heads.jsonl
    PYTHONPATH=. python benchmarks/closed_form_heads.py --pretrained LEARNER_OR_REPO --grow DIR/cifar10-jpeg.zip --tasks 5
    PYTHONPATH=. python benchmarks/closed_form_heads.py --report heads.jsonl
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BINS = 15


def expected_calibration_error(conf, right) -> float:
    """ECE over 15 equal-width bins of the top-class probability ``conf`` (``right``: 1 where the top class is)."""
    import torch

    edges = torch.linspace(0, 1, BINS + 1, dtype=torch.float64)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            ece += float(inside.double().mean()) * abs(float(right[inside].mean()) - float(conf[inside].double().mean()))
    return ece


def calibration(probs, labels) -> dict:
    """Accuracy, expected calibration error (15 bins), mean top-class probability, in %, and ``ece_floor``: the
    mean ECE of a perfectly calibrated model with the same probabilities on as many images (each right with
    its stated probability; 20 draws), what the number of test images alone leaves."""
    import torch

    conf, pred = probs.double().max(1)
    right = pred.eq(labels).double()
    gen = torch.Generator().manual_seed(0)
    floor = [expected_calibration_error(conf, (torch.rand(len(conf), generator=gen, dtype=torch.float64) < conf).double())
             for _ in range(20)]
    return {"acc": round(100 * float(right.mean()), 2), "ece": round(100 * expected_calibration_error(conf, right), 2),
            "conf": round(100 * float(conf.mean()), 2), "ece_floor": round(100 * sum(floor) / len(floor), 2)}


def decode(archive: zipfile.ZipFile, names: list[str], size: int):
    import numpy as np
    import torch
    from PIL import Image

    out = np.empty((len(names), 3, size, size), dtype=np.uint8)
    for i, name in enumerate(names):
        with Image.open(io.BytesIO(archive.read(name))) as image:
            rgb = image.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
            out[i] = np.asarray(rgb).transpose(2, 0, 1)
    return torch.from_numpy(out)


def grow_images(args: argparse.Namespace) -> tuple[list[str], dict[str, list[str]], zipfile.ZipFile]:
    """(classes, split -> member names in class order) of the data grown on."""
    import pretrained_path as pp

    archive = zipfile.ZipFile(args.data if args.grow == "tiny" else args.grow)
    names = pp.members(archive)
    classes = sorted({n.split("/")[2] for n in names})
    if args.grow == "tiny":
        classes = sorted(pp.class_split(classes)[1])
    files: dict[str, list[str]] = {"train": [], "test": []}
    for split, cap in (("train", args.per_class), ("test", args.test_per_class)):
        for cls in classes:
            files[split] += sorted(n for n in names if n.split("/")[1] == split and n.split("/")[2] == cls)[:cap]
    return classes, files, archive


def backbone_learner(args: argparse.Namespace, work: Path) -> Path:
    """A learner with no classes on the backbone (``--method ranpac``): what its features come from."""
    from sbcli import api
    from sbcli.run.backbone_learner import start_learner

    ref = args.pretrained
    arch, width, size = args.arch, args.width, args.image_size
    if ref is None:
        import pretrained_path as pp

        folder, _ = pp.build(args.data, work, 200, 10, 0)
        ns = argparse.Namespace(pretrain_epochs=15, threads=args.threads, arch="resnet18", width=0.25)
        print(json.dumps(pp.pretrain(folder, work / "backbone-learner", ns)), file=sys.stderr)
        ref, arch, width = str(work / "backbone-learner"), "resnet18", 0.25
    if Path(ref, "learner.json").is_file():
        state = json.loads(Path(ref, "learner.json").read_text())
        arch, width, size = state["arch"], state["width"], size or state["image_size"]
    out = work / ("start-" + "-".join(str(x) for x in (Path(ref).name, arch, width, size)))
    if not (out / "learner.json").is_file():
        run = api.RunOptions(method="ranpac", arch=arch, width=width, pretrained=ref, memory=0, device=args.device)
        start_learner(run, out, image_size=size)
    return out


def features(args: argparse.Namespace, work: Path) -> dict:
    import torch

    from sbcli.engine.loop import Engine, TrainConfig
    from sbcli.learner.state import Learner

    start = backbone_learner(args, work)
    key = "-".join(str(x) for x in (start.name, Path(args.grow).name, args.per_class, args.test_per_class))
    saved = work / f"features-{key}.safetensors"
    if saved.is_file():  # the features of one backbone on one data set are computed once
        from safetensors.torch import load_file

        out = dict(load_file(str(saved)))
        return {**out, **json.loads((saved.with_suffix(".json")).read_text())}
    learner = Learner.load(start, args.device)
    classes, files, archive = grow_images(args)
    engine = Engine(TrainConfig(threads=args.threads), torch.device(args.device), learner.norm, 0)
    out = {"classes": classes, "image_size": learner.state.image_size, "arch": learner.state.arch}
    for split, names in files.items():
        chunks = [engine.features(learner.model, decode(archive, names[i : i + 2000], learner.state.image_size))
                  for i in range(0, len(names), 2000)]
        out[split] = torch.cat(chunks).float()
        out[split + "_labels"] = torch.tensor([classes.index(n.split("/")[2]) for n in names])
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in out.items() if isinstance(v, torch.Tensor)}, str(saved))
    saved.with_suffix(".json").write_text(json.dumps({k: v for k, v in out.items() if not isinstance(v, torch.Tensor)}))
    return out


def saved_features(path: Path) -> dict:
    """The features ``benchmarks/efficientnet_lite.py --features FILE`` kept (its keys renamed to this script's)."""
    from safetensors.torch import load_file

    kept = load_file(str(path))
    meta = json.loads(path.with_suffix(".json").read_text())
    return {"train": kept["train"], "test": kept["test"], "train_labels": kept["train_y"],
            "test_labels": kept["test_y"], "classes": meta["classes"]}


def best_temperature_ece(scores, labels) -> float:
    """The lowest ECE (%) one temperature gives the head's scores (before any map) on these test images
    themselves: what no single temperature fitted elsewhere can beat."""
    from sbcli.methods import ranpac

    conf_right = [(p.max(1).values, p.argmax(1).eq(labels).double())
                  for p in ((scores.double() / t).softmax(1) for t in ranpac.TEMPERATURES)]
    return round(100 * min(expected_calibration_error(c, r) for c, r in conf_right), 2)


def grow_ranpac(feats: dict, order: list[int], tasks: int, head: str, projection: int, seed: int) -> list[dict]:
    import torch

    from sbcli.methods import ranpac
    from sbcli.methods.rules import score_map

    remap = torch.empty(len(order), dtype=torch.long)
    remap[torch.tensor(order)] = torch.arange(len(order))
    train_y, test_y = remap[feats["train_labels"]], remap[feats["test_labels"]]
    state = ranpac.RidgeState.start(feats["train"].shape[1], ranpac.Config(projection=projection), seed)
    size, steps = len(order) // tasks, []
    for t in range(tasks):
        seen = (t + 1) * size
        new = (train_y >= t * size) & (train_y < seen)
        start = time.perf_counter()
        step_args = (state, feats["train"][new], train_y[new], seen, None, seed * 1000 + t)
        state, w, chosen = ranpac.fit_step(*step_args, **({} if head == "ridge" else {"head": head}))
        seconds = time.perf_counter() - start
        test = test_y < seen
        scores = ranpac.project(feats["test"][test], state.projection).float() @ w.T
        if "bias" in chosen:
            scores = scores + chosen.pop("bias")
        tempered = scores
        scores = score_map.apply_map(scores, chosen.pop(score_map.KNOTS_KEY), chosen.pop(score_map.COEFFICIENTS_KEY))
        steps.append({**calibration(scores.softmax(1), test_y[test]), "seconds": round(seconds, 3),
                      "ece_best_temperature": best_temperature_ece(tempered, test_y[test]),
                      **{k: v for k, v in chosen.items() if k in ("ridge", "shrinkage", "temperature", "score_map")}})
    return steps


def grow_simplecil(feats: dict, order: list[int], tasks: int) -> list[dict]:
    import torch
    from torch.nn import functional as F

    from sbcli.methods import simplecil

    remap = torch.empty(len(order), dtype=torch.long)
    remap[torch.tensor(order)] = torch.arange(len(order))
    train_y, test_y = remap[feats["train_labels"]], remap[feats["test_labels"]]
    size, steps, state = len(order) // tasks, [], simplecil.PrototypeState.start()
    for t in range(tasks):
        seen = (t + 1) * size
        new = (train_y >= t * size) & (train_y < seen)
        start = time.perf_counter()
        normed = F.normalize(feats["train"][new], dim=1)
        state, scale = simplecil.fit_step(state, normed, normed, train_y[new], range(t * size, seen), t)
        seconds = time.perf_counter() - start
        test = test_y < seen
        scores = scale * F.normalize(feats["test"][test], dim=1) @ F.normalize(state.prototypes, dim=1).T
        steps.append({**calibration(scores.softmax(1), test_y[test]), "seconds": round(seconds, 3), "scale": scale})
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="tiny-imagenet-100-32px.zip: the self-trained backbone's classes")
    parser.add_argument("--pretrained", help="the backbone (default: the self-trained one, built from --data)")
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--image-size", type=int, help="default: the backbone's own resolution")
    parser.add_argument("--grow", default="tiny", help="'tiny' (the other half of --data) or a class-per-folder zip")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=200)
    parser.add_argument("--test-per-class", type=int)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--projections", type=int, nargs="+", default=[0, 2000, 5000])
    parser.add_argument("--heads", nargs="+", default=["ridge", "lda", "simplecil"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-closed-form-heads")
    parser.add_argument("--tag", default="", help="a word the rows carry, e.g. which sbcli they ran on (shown after the head)")
    parser.add_argument("--features", type=Path, help="a features file of benchmarks/efficientnet_lite.py --features "
                        "(every image's features on EfficientNet-Lite0, by sb add-task's own pass): no backbone run here")
    parser.add_argument("--report", type=Path, help="print the tables of a JSON-lines file of earlier runs and exit")
    args = parser.parse_args()
    if args.report:
        report(args.report)
        return
    if args.pretrained is None and args.data is None and args.features is None:
        parser.error("give --pretrained REF, or --data tiny-imagenet-100-32px.zip for the self-trained backbone")
    import torch

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    feats = features(args, args.work) if args.features is None else saved_features(args.features)
    grow = ("tiny-imagenet-100 (other 50)" if args.grow == "tiny" else Path(args.grow).name) if args.features is None \
        else args.features.name
    backbone = args.pretrained or ("efficientnet-lite0" if args.features else "self-trained resnet18 x0.25")
    print(f"features: {len(feats['train'])} train, {len(feats['test'])} test, D={feats['train'].shape[1]}, "
          f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    for seed in args.seeds:
        order = list(range(len(feats["classes"])))
        random.Random(seed).shuffle(order)
        for head in args.heads:
            for projection in ([None] if head == "simplecil" else args.projections):
                steps = (grow_simplecil(feats, order, args.tasks) if head == "simplecil"
                         else grow_ranpac(feats, order, args.tasks, head, projection, seed))
                label = f"{head} ({args.tag})" if args.tag else head
                print(json.dumps({"backbone": backbone, "grow": grow, "tasks": args.tasks, "seed": seed, "head": label,
                                  "projection": projection, "dim": feats["train"].shape[1], "steps": steps}), flush=True)


def report(path: Path) -> None:
    import statistics

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["backbone"], r["grow"], r["tasks"]), []).append(r)
    for (backbone, grow, tasks), mine in groups.items():
        print(f"\n{backbone}, grown on {grow} in {tasks} tasks (D = {mine[0]['dim']}):\n")
        print("| head | projection | seeds | avg acc 1..T | last acc | last ECE | last conf | last ECE floor | last ECE, best single T | worst ECE over steps | step s (median) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for key in dict.fromkeys((r["head"], r["projection"]) for r in mine):
            runs = [r for r in mine if (r["head"], r["projection"]) == key]

            def mean(f, runs: list[dict] = runs) -> float:
                return statistics.mean(f(r) for r in runs)

            print(f"| {key[0]} | {'-' if key[1] is None else key[1]} | {len(runs)} | "
                  f"{mean(lambda r: statistics.mean(s['acc'] for s in r['steps'])):.1f} | "
                  f"{mean(lambda r: r['steps'][-1]['acc']):.1f} | {mean(lambda r: r['steps'][-1]['ece']):.1f} | "
                  f"{mean(lambda r: r['steps'][-1]['conf']):.1f} | {mean(lambda r: r['steps'][-1].get('ece_floor', float('nan'))):.1f} | "
                  f"{mean(lambda r: r['steps'][-1].get('ece_best_temperature', float('nan'))):.1f} | "
                  f"{mean(lambda r: max(s['ece'] for s in r['steps'])):.1f} | "
                  f"{mean(lambda r: statistics.median(s['seconds'] for s in r['steps'])):.2f} |")
        print("\n| head | projection | seed | per step: accuracy / ECE / mean top-class probability (%) |\n|---|---|---|---|")
        for r in mine:
            cells = "; ".join(f"{s['acc']:.1f}/{s['ece']:.1f}/{s['conf']:.1f}" for s in r["steps"])
            print(f"| {r['head']} | {'-' if r['projection'] is None else r['projection']} | {r['seed']} | {cells} |")


if __name__ == "__main__":
    main()
