"""Turn `sb train` options into typed configs and run them, rendering as we go.

Precedence: options given on the command line, then the recipe, then the source's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sbcli.cli import render
from sbcli.errors import ConfigError

METHOD_KEYS = ("inference", "rho", "sparsity", "gamma", "bn_reset")
# What a recipe may set: the `sb train` options that describe an experiment (plus the class order
# as a list). Output, device and run-control flags stay on the command line.
RECIPE_KEYS = frozenset({
    "source", "test", "data_root", "image_size", "tasks", "base", "increment", "classes", "order_seed", "class_order",
    "method", *METHOD_KEYS, "phase_epochs", "arch", "width", "epochs", "batch_size", "lr", "memory", "selection",
    "seed", "recipe_path",
})


def _phase_epochs(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    parts = [p.strip() for p in str(value).split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError("--phase-epochs takes three whole numbers A,B,C, e.g. 200,200,200.")
    return dict(zip(("epochs_a", "epochs_b", "epochs_c"), map(int, parts), strict=True))


def merge(given: dict, defaults: dict) -> dict:
    """Given options over the recipe over the defaults (None means not given)."""
    from sbcli.recipes import load_recipe

    recipe = load_recipe(given["recipe"], given["source"]) if given.get("recipe") else {}
    unknown = sorted(set(recipe) - RECIPE_KEYS)
    if unknown:
        raise ConfigError(f"Recipe {recipe['recipe_path']} sets {', '.join(unknown)}, which are not `sb train` "
                          "options a recipe may set; rename or remove them.")
    merged = dict(defaults)
    merged.update({k: v for k, v in recipe.items() if k != "source"})
    merged.update({k: v for k, v in given.items() if v is not None})
    if recipe.get("source") and given.get("source") not in (None, recipe["source"]):
        raise ConfigError(f"Recipe {given['recipe']} is for {recipe['source']}, not {given['source']}; drop one of them.")
    merged["source"] = given.get("source") or recipe.get("source")
    return merged


def build_options(given: dict, defaults: dict):
    """(SequenceOptions, RunOptions, out) from the command's options."""
    from sbcli.api import RunOptions, SequenceOptions
    from sbcli.engine import TrainConfig

    o = merge(given, defaults)
    method_options = {k: o.get(k) for k in METHOD_KEYS} | _phase_epochs(o.get("phase_epochs"))
    order_seed = None if o["order_seed"] == -1 else o["order_seed"]
    seq = SequenceOptions(source=o["source"], test=_str(o.get("test")), data_root=o.get("data_root"),
                          download=o.get("download", False), image_size=o.get("image_size"),
                          tasks=None if o.get("base") else o.get("tasks"), base=o.get("base"),
                          increment=o.get("increment"), order_seed=order_seed, class_order=o.get("class_order"),
                          classes=o.get("classes"), test_sample=not o.get("no_test_sample", False))
    train = TrainConfig(epochs=o["epochs"], batch_size=o["batch_size"], lr=o["lr"], compile=o.get("compile", False),
                        precision=o.get("precision", "auto"))
    run = RunOptions(method=o["method"], method_options=method_options, arch=o["arch"], width=o["width"], train=train,
                     memory=o["memory"], selection=o["selection"], seed=o["seed"], device=o.get("device", "auto"))
    return seq, run, Path(o["out"])


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def run_training(seq: Any, run: Any, out: Path, *, resume: bool, json_out: bool, keep: int | None = None) -> None:
    from sbcli import api, distributed
    from sbcli.metrics import summary

    every = max(1, run.train.epochs // 10)
    main = distributed.is_main_process()  # under torchrun, rank 0 alone prints
    if main:
        render.ERR.print(f"Training [bold]{run.method}[/] on {seq.source or 'demo'} → {out}", highlight=False)
    with distributed.session(run.device):
        learner = api.train(seq, run, out, resume=resume, keep=keep, on_progress=render.ProgressPrinter(every),
                            on_step=render.step_line)
    if not main:
        return
    history = learner.state.history
    result = summary([h["metrics"]["overall"] for h in history], [h["metrics"]["per_task"] for h in history])
    if json_out:
        render.print_json({"learner": str(out), "history": history, "summary": result})
        return
    render.OUT.print(render.history_table(history))
    ablation = render.ablation_table(history)
    if ablation is not None:
        render.OUT.print(ablation)
    render.OUT.print(render.summary_table(result))
    render.OUT.print(f"Learner saved to {out}; add classes with `sb add-task {out} FOLDER --test FOLDER`.")
