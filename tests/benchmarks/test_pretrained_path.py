"""benchmarks/pretrained_path.py without training: the class split, the task folders it writes from the
backbone's zip or from a second zip to grow on (``--grow-data``), and the report's grouping by that data."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import pretrained_path as pp  # noqa: E402

sys.path.remove(str(BENCHMARKS))


def fake_zip(path: Path, top: str, classes: list[str], train: int, test: int) -> Path:
    """A class-per-folder zip of the layout both real zips have; the files need not be images here."""
    with zipfile.ZipFile(path, "w") as archive:
        for cls in classes:
            for split, count in (("train", train), ("test", test)):
                for i in range(count):
                    archive.writestr(f"{top}/{split}/{cls}/{i:04d}.jpg", f"{cls}-{split}-{i}")
    return path


def classes_of(folders: list[tuple[Path, Path]]) -> list[list[str]]:
    return [sorted(p.name for p in train.iterdir()) for train, _ in folders]


def test_the_split_is_a_fixed_half_whatever_the_order_given():
    names = [f"n{i:02d}" for i in range(10)]
    backbone, grow = pp.class_split(names)
    assert len(backbone) == len(grow) == 5 and not set(backbone) & set(grow)
    assert pp.class_split(list(reversed(names))) == (backbone, grow)


def test_without_grow_data_the_tasks_hold_the_other_half(tmp_path: Path):
    names = [f"n{i:02d}" for i in range(8)]
    tiny = fake_zip(tmp_path / "tiny.zip", "tiny", names, train=6, test=3)
    folder, tasks = pp.build(tiny, tmp_path / "work", per_class=4, tasks=2, seed=0)
    backbone, grow = pp.class_split(names)
    assert sorted(p.name for p in (folder / "train").iterdir()) == backbone
    assert len(tasks) == 2 and sorted(sum(classes_of(tasks), [])) == sorted(grow)
    assert tasks[0][0].parent == tmp_path / "work" / "grow-s0" / "task1"  # the folders earlier runs wrote
    assert len(list((tasks[0][0] / classes_of(tasks)[0][0]).iterdir())) == 4
    assert len(list((tasks[0][1] / classes_of(tasks)[0][0]).iterdir())) == 3


def test_grow_data_grows_on_all_its_classes_with_both_caps_and_an_order_by_seed(tmp_path: Path):
    tiny = fake_zip(tmp_path / "tiny.zip", "tiny", [f"n{i:02d}" for i in range(4)], train=3, test=2)
    cifar = fake_zip(tmp_path / "cifar10-jpeg.zip", "cifar10-jpeg", [f"c{i}" for i in range(10)], train=8, test=6)
    folder, tasks = pp.build(tiny, tmp_path / "work", per_class=5, tasks=5, seed=0, grow_zip=cifar, test_per_class=4)
    assert folder == tmp_path / "work" / "backbone" and (folder / "train").is_dir()
    assert [len(c) for c in classes_of(tasks)] == [2] * 5
    assert sorted(sum(classes_of(tasks), [])) == [f"c{i}" for i in range(10)]
    first = classes_of(tasks)[0][0]
    assert sorted(p.name for p in (tasks[0][0] / first).iterdir()) == [f"{i:04d}.jpg" for i in range(5)]
    assert len(list((tasks[0][1] / first).iterdir())) == 4
    assert tasks[0][0].parent.parent.name == "grow-cifar10-jpeg-n5-t4-s0"
    _, other = pp.build(tiny, tmp_path / "work", per_class=5, tasks=5, seed=1, grow_zip=cifar, test_per_class=4)
    assert classes_of(other) != classes_of(tasks)
    assert sorted(sum(classes_of(other), [])) == sorted(sum(classes_of(tasks), []))


def test_the_report_keeps_each_grow_data_apart(tmp_path: Path):
    def run(method: str, seed: int, overall: list[float], grow: str | None) -> dict:
        row = {"method": method, "seed": seed, "overall": overall, "add_task_s": [1.0] * (len(overall) - 1),
               "summary": {"avg_incremental_1_to_T": sum(overall) / len(overall), "last": overall[-1]}}
        return row if grow is None else {**row, "grow": grow, "step_s": [0.5 + seed] * (len(overall) - 1)}

    rows = [{"backbone_top1": 27.0}, run("ranpac", 0, [60.0, 40.0, 30.0], None),
            {"backbone_top1": 27.0}, run("ranpac", 0, [90.0, 80.0], "cifar10-jpeg.zip"),
            run("ranpac", 1, [70.0, 60.0], "cifar10-jpeg.zip")]
    lines = tmp_path / "runs.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(BENCHMARKS / "pretrained_path.py"), "--report", str(lines)],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    assert out.count("Backbone: top-1 27.0 %") == 1
    tiny, cifar = out.split("Grown on cifar10-jpeg.zip in 2 tasks:")
    assert "Grown on tiny-imagenet-100-32px.zip in 3 tasks:" in tiny and "| ranpac | 1 | 43.3 | 30.0 | 1.0 | - |" in tiny
    assert "| ranpac | 2 | 75.0 (65.0-85.0) | 70.0 (60.0-80.0) | 1.0 (1.0-1.0) | 1.0 (0.5-1.5) |" in cifar
