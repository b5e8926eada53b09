"""PyCIL's WA on a class-per-folder data set: the reference the own-data defaults are set against.

    python benchmarks/pycil_wa.py --pycil PATH/TO/PyCIL --data DIR --seed S [--out results.jsonl]

``PATH/TO/PyCIL`` is a checkout of https://github.com/G-U-N/PyCIL (run as it is: nothing of it is
copied here); its requirements beyond torch are scipy and tqdm. ``DIR`` holds ``train/CLASS/*`` and
``test/CLASS/*`` (what benchmarks/own_data_defaults.py cuts, e.g. ``WORK/data/t20a-0-20x250``).
The recipe is the one the ``t20`` configurations copy: ResNet-32, SGD lr 0.01, momentum 0.9, weight
decay 2e-4, batch 128, 10 epochs a step with drops at epochs 4, 7 and 9, 5 classes a task, memory
400 (herding), T = 2; PyCIL's own CIFAR augmentation (crop with padding 4, flip, brightness jitter)
and CIFAR-100 normalisation, one CPU thread. PyCIL shuffles the class order with ``--seed``
(``np.random.seed``), a different order from sbcli's for the same seed.

Prints PyCIL's accuracy curve (its ``CNN top1 curve``: all seen classes after each step) and the
average over steps 1..T, and appends them as one JSON line to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
from pathlib import Path


class Curve(logging.Handler):
    """Keeps the last ``CNN top1 curve: [...]`` PyCIL logs (after every step)."""

    def __init__(self) -> None:
        super().__init__()
        self.top1: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.msg)  # PyCIL formats this line itself (and passes stray arguments elsewhere)
        if text.startswith("CNN top1 curve: "):
            self.top1 = json.loads(re.sub(r"np\.float\d+\(([^)]*)\)", r"\1", text.split(": ", 1)[1]))  # numpy 2's repr


def run(pycil: Path, data: Path, work: Path, seed: int, epochs: int, tasks_of: int, memory: int) -> list[float]:
    import torch
    from torchvision import datasets, transforms

    torch.set_num_threads(1)
    sys.path.insert(0, str(pycil))
    import trainer
    import utils.data as pycil_data
    from models import wa
    from utils import data_manager
    from utils.toolkit import split_images_labels

    class Folder(pycil_data.iData):
        use_path = True
        train_trsf = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                      transforms.ColorJitter(brightness=63 / 255), transforms.ToTensor()]
        test_trsf = [transforms.ToTensor()]
        common_trsf = [transforms.Normalize(mean=(0.5071, 0.4867, 0.4408), std=(0.2675, 0.2565, 0.2761))]

        def download_data(self) -> None:
            train, test = datasets.ImageFolder(str(data / "train")), datasets.ImageFolder(str(data / "test"))
            self.class_order = list(range(len(train.classes)))
            self.train_data, self.train_targets = split_images_labels(train.imgs)
            self.test_data, self.test_targets = split_images_labels(test.imgs)

    drops = [round(epochs * f) for f in (0.4, 0.7, 0.9)]
    data_manager._get_idata = lambda name: Folder()
    for name, value in dict(init_epoch=epochs, init_lr=0.01, init_milestones=drops, init_weight_decay=2e-4,
                            epochs=epochs, lrate=0.01, milestones=drops, weight_decay=2e-4, batch_size=128,
                            num_workers=0).items():
        setattr(wa, name, value)
    trainer._set_device = lambda args: args.__setitem__("device", [torch.device("cpu")])  # its own reads "cuda:N"
    curve = Curve()  # set up before PyCIL's basicConfig, which then leaves the root logger as it is
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(filename)s] => %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout), curve])
    os.chdir(work)  # PyCIL writes its logs/ below the working directory
    trainer.train({"prefix": "folder", "dataset": "folder", "memory_size": memory, "memory_per_class": 20,
                   "fixed_memory": False, "shuffle": True, "init_cls": tasks_of, "increment": tasks_of,
                   "model_name": "wa", "convnet_type": "resnet32", "device": ["cpu"], "seed": [seed]})
    return curve.top1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pycil", type=Path, required=True, help="a PyCIL checkout")
    parser.add_argument("--data", type=Path, required=True, help="a folder with train/CLASS and test/CLASS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=10, help="a step's epochs (drops at 40, 70, 90 %%)")
    parser.add_argument("--classes-per-task", type=int, default=5)
    parser.add_argument("--memory", type=int, default=400)
    parser.add_argument("--out", type=Path, default=None, help="append the result as a JSON line here")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pycil-wa",
                        help="where PyCIL writes its logs")
    args = parser.parse_args()
    if not (args.pycil / "models" / "wa.py").is_file():
        parser.error(f"{args.pycil} is not a PyCIL checkout (no models/wa.py)")
    if not (args.data / "train").is_dir() or not (args.data / "test").is_dir():
        parser.error(f"{args.data} has no train/ and test/ folders")
    args.work.mkdir(parents=True, exist_ok=True)
    out = None if args.out is None else args.out.resolve()
    top1 = run(args.pycil.resolve(), args.data.resolve(), args.work, args.seed, args.epochs, args.classes_per_task, args.memory)
    result = {"method": "pycil-wa", "data": args.data.name, "seed": args.seed, "epochs": args.epochs,
              "memory": args.memory, "top1": top1, "avg_1_T": sum(top1) / len(top1) if top1 else None}
    print(json.dumps(result))
    if out is not None:
        with out.open("a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
