"""Attack families against the `sb` commands, each case checked for what must hold; prints cases tried and held.

Every case runs the real command line (in this process, through Typer's test runner) on a small
learner trained here from generated images, and checks:

* ``outside-files``: folders beside or inside a learner that only look like a save's leftovers
  (``.L.old-*``, ``.L.tmp-*``, ``steps/NNNN``) and ``--out`` folders holding a user's ``steps/``: every
  user file is byte for byte as it was;
* ``learner-json``: a valid-JSON edit of each field of ``learner.json``: refused in one sentence
  at load, the learner's bytes unchanged;
* ``task-files``: what a task folder may hold that is no image (a 1 GiB sparse file, links to
  ``/dev/zero`` and ``/dev/null``, a FIFO, a socket, a dangling link, a link loop, a class folder
  1,000 levels deep): refused in one sentence within 20 s (or, the deep folder, learned), the
  learner's bytes unchanged when refused;
* ``option-values``: every numeric option of ``train``, ``add-task``, ``evaluate``, ``export``,
  ``predict``, ``pull`` and ``rollback`` at NaN, infinities, huge, negative and malformed values:
  one sentence (or Typer's usage error) and nothing written, or a finished command whose learner
  loads again.

    PYTHONPATH=. python benchmarks/probe_families.py [--families outside-files,learner-json,...]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import socket
import tempfile
import time
import typing
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

HOSTILE = ["nan", "inf", "-inf", "1e400", "-1", "0", "1180591620717411303424", "-99999999999999999999", "abc", "1.5", "2"]
COLOURS = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200), "yellow": (200, 200, 30)}
SMALL = ["--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8", "--image-size", "16",
         "--device", "cpu", "--quiet"]


def images(root: Path, classes: list[str], per_class: int = 8, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = np.clip(np.array(COLOURS[name]) + rng.normal(0, 25, (16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def tree(folder: Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink() and not p.name.startswith(".sbcli.lock")}


class Probe:
    def __init__(self, work: Path) -> None:
        from typer.testing import CliRunner

        from sbcli.cli.app import app

        self.app, self.runner, self.work = app, CliRunner(), work
        self.task1 = images(work / "data" / "t1", ["red", "green"])
        self.task2 = images(work / "data" / "t2", ["blue", "yellow"], seed=1)
        self.base = work / "base"
        assert self.sb("train", self.task1, "--out", self.base, "--method", "std", *SMALL).exit_code == 0

    def sb(self, *args: object):
        return self.runner.invoke(self.app, [str(a) for a in args])

    def fresh(self, name: str) -> Path:
        target = self.work / "cases" / name / "L"
        shutil.rmtree(target.parent, ignore_errors=True)
        target.parent.mkdir(parents=True)
        shutil.copytree(self.base, target)
        return target


def one_sentence(res) -> bool:
    if res.exit_code == 2:
        return res.output.startswith("Usage: sb ")
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error: ")]
    return (res.exit_code == 1 and len(errors) == 1 and "Traceback" not in res.output
            and "Unexpected error" not in res.output)


def outside_files(p: Probe) -> list[tuple[str, bool]]:
    cases: list[tuple[str, Callable[[Path], Path]]] = []

    def beside(kind: str, content: Callable[[Path], None]) -> Callable[[Path], Path]:
        def plant(learner: Path) -> Path:
            folder = learner.parent / f".L.{kind}"
            folder.mkdir()
            content(folder)
            return folder
        return plant

    cases += [("old-backup with a photo", beside("old-backup", lambda f: (f / "photo.jpg").write_text("photo"))),
              ("tmp folder with a photo", beside("tmp-x", lambda f: (f / "photo.jpg").write_text("photo"))),
              ("old folder, nested photos", beside("old-7", lambda f: ((f / "a" / "b").mkdir(parents=True),
                                                                       (f / "a" / "b" / "p.jpg").write_text("p")))),
              ("a learner copy plus notes", beside("old-8", lambda f: (shutil.copytree(p.base, f, dirs_exist_ok=True),
                                                                       (f / "notes.txt").write_text("mine")))),
              # a whole learner copy and nothing else: a name alone, even a pid's, proves no 0.1 save wrote it
              *((f"a whole learner copy as .L.{kind}", beside(kind, lambda f: shutil.copytree(p.base, f, dirs_exist_ok=True)))
                for kind in ("old-copy", "old-1234", "tmp-abcdefgh"))]

    def inside(name: str) -> Callable[[Path], Path]:
        def plant(learner: Path) -> Path:
            folder = learner / "steps" / name
            folder.mkdir(parents=True)
            (folder / "photo.jpg").write_text("photo")
            return folder
        return plant

    cases += [("steps/2023 inside a learner", inside("2023")), ("steps/.hidden inside a learner", inside(".hidden")),
              ("steps/0099 inside a learner", inside("0099"))]
    results = []
    for name, plant in cases:
        learner = p.fresh(name.replace(" ", "-").replace("/", "-"))
        planted = plant(learner)
        before = tree(planted)
        res = p.sb("add-task", learner, p.task2, "--device", "cpu", "--epochs", "1", "--quiet")
        results.append((name, res.exit_code == 0 and tree(planted) == before))
    for name, sub in (("--out with steps/2023/photo.jpg", "steps/2023"), ("--out with steps/0001/photo.jpg", "steps/0001"),
                      ("--out with a temporary and notes", None)):
        out = p.work / "cases" / f"out-{len(results)}"
        shutil.rmtree(out, ignore_errors=True)
        if sub:
            (out / sub).mkdir(parents=True)
            (out / sub / "photo.jpg").write_text("photo")
        else:
            out.mkdir(parents=True)
            (out / "learner.json.tmp-1").write_text("{")
            (out / "notes.txt").write_text("mine")
        before = tree(out)
        res = p.sb("train", p.task1, "--out", out, "--method", "std", *SMALL)
        results.append((name, one_sentence(res) and tree(out) == before))
    return results


def learner_json(p: Probe) -> list[tuple[str, bool]]:
    edits: dict[str, Callable[[dict], None]] = {
        "arch": lambda s: s.__setitem__("arch", "resnet32"),
        "width": lambda s: s.__setitem__("width", 0.25),
        "image_size": lambda s: s.__setitem__("image_size", 32),
        "normalization.std": lambda s: s["normalization"]["std"].__setitem__(0, 0.5),
        "normalization.mean": lambda s: s["normalization"]["mean"].__setitem__(1, 0.1),
        "method": lambda s: s.__setitem__("method", "finetune"),
        "train_config.lr": lambda s: s["train_config"].__setitem__("lr", 0.5),
        "train_config.epochs": lambda s: s["train_config"].__setitem__("epochs", 7),
        "memory.budget": lambda s: s["memory"].__setitem__("budget", 9),
        "seed": lambda s: s.__setitem__("seed", 5),
        "class_names swapped": lambda s: s["class_names"].reverse(),
        "class_names renamed": lambda s: s["class_names"].__setitem__(0, "cat"),
        "tasks[0].source.name": lambda s: s["tasks"][0]["source"].__setitem__("name", "other"),
        "history metric": lambda s: s["history"][0]["metrics"].__setitem__("overall", 99.0),
        "history seconds": lambda s: s["history"][0].__setitem__("seconds", 1.0),
        "provenance": lambda s: s["provenance"].__setitem__("dataset", "elsewhere"),
        "plan.scenario": lambda s: s["plan"]["scenario"]["order"].reverse(),
        "test_sample.cap": lambda s: s["test_sample"].__setitem__("cap", 1),
    }
    results = []
    for name, edit in edits.items():
        learner = p.fresh("json-" + name.replace(" ", "-"))
        state = json.loads((learner / "learner.json").read_text())
        edit(state)
        (learner / "learner.json").write_text(json.dumps(state, indent=2))
        before = tree(learner)
        res = p.sb("evaluate", learner, "--device", "cpu")
        results.append((name, one_sentence(res) and tree(learner) == before))
    return results


def task_files(p: Probe) -> list[tuple[str, bool]]:
    def sparse(f: Path) -> None:
        with open(f / "huge.jpg", "wb") as out:
            out.truncate(1 << 30)

    def unix_socket(f: Path) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(f / "s.png"))
        s.close()

    def deep(f: Path) -> None:
        here = os.getcwd()
        os.chdir(f)
        try:
            for _ in range(1000):
                os.mkdir("d")
                os.chdir("d")
            Image.new("RGB", (16, 16), (30, 30, 200)).save("deep.png")
        finally:
            os.chdir(here)

    plants: dict[str, Callable[[Path], None]] = {
        "1 GiB sparse huge.jpg": sparse, "x.png -> /dev/zero": lambda f: (f / "x.png").symlink_to("/dev/zero"),
        "x.png -> /dev/null": lambda f: (f / "x.png").symlink_to("/dev/null"), "FIFO x.png": lambda f: os.mkfifo(f / "x.png"),
        "socket s.png": unix_socket, "dangling link": lambda f: (f / "gone.png").symlink_to(f / "nowhere.png"),
        "link loop": lambda f: (f / "loop").symlink_to(f), "class folder 1,000 deep": deep,
    }
    results = []
    for name, plant in plants.items():
        learner = p.fresh("files-" + str(len(results)))
        data = p.work / "cases" / f"data-{len(results)}"
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(p.task2, data)
        plant(data / "blue")
        before = tree(learner)
        start = time.perf_counter()
        res = p.sb("add-task", learner, data, "--device", "cpu", "--epochs", "1", "--quiet")
        quick = time.perf_counter() - start < 20
        held = quick and (one_sentence(res) and tree(learner) == before if name != "class folder 1,000 deep"
                          else res.exit_code == 0)
        results.append((name, held))
        _remove(data)
    return results


def _remove(folder: Path) -> None:
    """Remove a tree that may be 1,000 levels deep (shutil.rmtree and os.walk recurse): files first, then the
    folders deepest first."""
    stack, folders = [str(folder)], []
    while stack:
        current = stack.pop()
        folders.append(current)
        for entry in os.scandir(current):
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            else:
                os.unlink(entry.path)
    for current in reversed(folders):
        os.rmdir(current)


def numeric_options(command: str) -> list[str]:
    import typer

    from sbcli.cli.app import app

    callback = next(c.callback for c in app.registered_commands if c.name == command)
    flags = []
    for param in inspect.signature(callback, eval_str=True).parameters.values():
        if typing.get_origin(param.annotation) is not typing.Annotated:
            continue
        base, *meta = typing.get_args(param.annotation)
        kinds = [a for a in typing.get_args(base) if a is not type(None)] or [base]
        info = next((m for m in meta if isinstance(m, typer.models.OptionInfo)), None)
        if info is not None and kinds[0] in (int, float):
            decls = [d for d in (info.param_decls or ()) if d.startswith("--")]
            flags.append(decls[0] if decls else "--" + param.name.replace("_", "-"))
    return flags


def option_values(p: Probe) -> list[tuple[str, bool]]:
    from sbcli.learner.state import Learner

    onnx = p.work / "model.onnx"
    p.sb("export", p.base, "-o", onnx, "--quiet")
    results = []
    base_args = dict(zip(SMALL[0:10:2], SMALL[1:10:2], strict=True))
    for command in ("train", "add-task", "evaluate", "export", "predict", "pull", "rollback"):
        for flag in numeric_options(command) + (["STEP"] if command == "rollback" else []):
            for value in HOSTILE:
                learner = p.fresh("opt")
                out = p.work / "cases" / "opt-out"
                shutil.rmtree(out, ignore_errors=True)
                extra = [] if flag == "STEP" else [flag, value]
                args = {
                    "train": ["train", p.task1, "--out", out, "--method", "std", "--device", "cpu", "--quiet",
                              *[x for k, v in base_args.items() if k != flag for x in (k, v)], *extra],
                    "add-task": ["add-task", learner, p.task2, "--device", "cpu", "--quiet", *extra],
                    "evaluate": ["evaluate", learner, "--device", "cpu", *extra],
                    "export": ["export", learner, "-o", out.with_suffix(".onnx"), "--overwrite", "--quiet", *extra],
                    "predict": ["predict", onnx, p.task1, *extra],
                    "pull": ["pull", "demo-sb-tiny", "-o", out, "--quiet", *extra],
                    "rollback": ["rollback", learner, value if flag == "STEP" else "1", *extra],
                }[command]
                before = tree(learner)
                res = p.sb(*args)
                if res.exit_code == 0:
                    written = out if command in ("train", "pull") else learner
                    held = "Traceback" not in res.output and _loads(Learner, written)
                else:
                    held = one_sentence(res) and tree(learner) == before and not out.exists()
                results.append((f"{command} {flag} {value}", held))
    return results


def _loads(learner_cls, folder: Path) -> bool:
    try:
        learner_cls.load(folder, "cpu")
    except Exception:  # noqa: BLE001  (any failure to load is what this case looks for)
        return False
    return True


FAMILIES = {"outside-files": outside_files, "learner-json": learner_json, "task-files": task_files,
            "option-values": option_values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--show-failures", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        probe = Probe(Path(tmp))
        print("| family | cases | held | seconds |\n|---|---:|---:|---:|")
        for family in args.families.split(","):
            start = time.perf_counter()
            results = FAMILIES[family](probe)
            held = sum(ok for _, ok in results)
            print(f"| {family} | {len(results)} | {held} | {time.perf_counter() - start:.0f} |", flush=True)
            if args.show_failures:
                for name, ok in results:
                    if not ok:
                        print(f"  not held: {name}")


if __name__ == "__main__":
    main()
