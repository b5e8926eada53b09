"""The one config layer: what a run is set to, from the source's defaults, a recipe and the options given.

Both faces use it: `sb train` and `sb bench` pass the options a user typed, a notebook calls
:func:`sbcli.api.options` (or builds the dataclasses itself), so the two cannot disagree.
Precedence: options given, then the recipe, then the source's defaults, then the dataclasses'
own defaults. ``None`` means "not given" everywhere.

Every setting is a field of one dataclass, and is routed there by its name: the sequence
(:class:`SequenceOptions`), the run (:class:`RunOptions`), the engine
(:class:`sbcli.engine.loop.TrainConfig`) or a method's ``Config``. Adding a setting is one field plus
one CLI option named after it (``--weight-decay`` for ``weight_decay``); recipes can set it at
once, and the learner records it (``train_config`` / ``method_config`` in ``learner.json``).

This module imports torch (through the engine): the CLI imports it inside command bodies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError

# What a run uses when an option is not given: the paper's settings for benchmarks, and a
# CPU-sized budget for the bundled demo so that `sb train` alone ends in a few minutes.
# Own-data additions, measured (docs/benchmarks.md): warm-up on, class-balanced fine-tuning on (the paper
# recipes and `sb bench`: neither); zero-init measured harmful.
GLOBAL_DEFAULTS = {"method": "sb", "arch": "resnet18", "lr": 0.1, "selection": "random", "seed": 0, "order_seed": 0,
                   "warmup_epochs": 1.0, "zero_init_residual": False, "balance_epochs": 2}
DEMO_DEFAULTS = {"tasks": 5, "width": 0.25, "epochs": 8, "batch_size": 64, "memory": 200}  # measured: benchmarks.md, "The demo's budget"
PAPER_DEFAULTS = {"tasks": 10, "width": 1.0, "epochs": 200, "batch_size": 256, "memory": 2000}
FOLDER_DEFAULTS = {"tasks": 1, "width": 1.0, "epochs": 30, "batch_size": 128, "memory": 2000}
PAPER_BENCHMARKS = ("cifar10", "cifar100", "tiny-imagenet")
# `sb bench` rebuilds the paper's comparison: no warm-up, no zero-initialised residual BNs, no balancing unless asked.
BENCH_KEEPS_ENGINE_DEFAULTS = ("warmup_epochs", "zero_init_residual", "balance_epochs")


def defaults_for(source: str | None) -> dict:
    """The defaults of a source: the demo's CPU budget, the paper's for benchmarks, a folder's otherwise."""
    if source in (None, "demo"):
        return {**GLOBAL_DEFAULTS, **DEMO_DEFAULTS}
    if source in PAPER_BENCHMARKS:
        return {**GLOBAL_DEFAULTS, **PAPER_DEFAULTS}
    return {**GLOBAL_DEFAULTS, **FOLDER_DEFAULTS}


def bench_defaults(source: str | None) -> dict:
    """`sb bench`: the demo's CPU budget for the demo, the paper's budget for everything else; task counts as a list."""
    base = DEMO_DEFAULTS if source in (None, "demo") else PAPER_DEFAULTS
    shared = {k: v for k, v in GLOBAL_DEFAULTS.items() if k not in BENCH_KEEPS_ENGINE_DEFAULTS}
    return {**shared, **base, "tasks": "2,5" if source in (None, "demo") else "2,5,10,20"}


@dataclass(frozen=True)
class RunOptions:
    """Everything a run is configured with, built once at the boundary."""

    method: str = "sb"
    method_options: dict[str, Any] = field(default_factory=dict)
    arch: str = "resnet18"
    width: float = 1.0
    train: TrainConfig = TrainConfig()
    memory: int = 2000
    selection: str = "random"
    seed: int = 0
    device: str = "auto"
    pretrained: str | None = None  # Hub repo OWNER/NAME[@REVISION] or a .safetensors file (sbcli.hub.pretrained)
    pretrained_sha256: str | None = None


@dataclass(frozen=True)
class SequenceOptions:
    """What to learn: a source, its class order and its cut into tasks."""

    source: str | None = None
    test: str | None = None
    data_root: str | None = None
    download: bool = False
    image_size: int | None = None
    tasks: int | None = None
    base: int | None = None
    increment: int | None = None
    order_seed: int | None = 0
    class_order: list[int] | None = None
    classes: int | None = None  # keep only the first N classes of the class order (a smaller benchmark)
    test_sample: bool = True  # carry a capped sample of the test images in the learner (False: private data)


# How fast and where a run goes, not what it computes: a recipe may not set these.
RUN_CONTROL = frozenset({"out", "resume", "device", "download", "compile", "precision", "threads", "eval_batch_size",
                         "recipe"})
PHASE_EPOCHS = ("epochs_a", "epochs_b", "epochs_c")  # sb's --phase-epochs A,B,C


def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def engine_keys() -> frozenset[str]:
    """The engine's settings (fields of :class:`TrainConfig`)."""
    return _fields(TrainConfig)


def method_keys() -> frozenset[str]:
    """Every field of every registered method's Config."""
    from sbcli.methods import METHODS

    return frozenset().union(*(_fields(METHODS.get(name).config) for name in METHODS.names()))


def known_keys() -> frozenset[str]:
    """Every setting a run takes, by name."""
    run = _fields(RunOptions) - {"train", "method_options"}
    return _fields(SequenceOptions) | run | engine_keys() | method_keys() | {"phase_epochs", "out", "resume", "recipe"}


def recipe_keys() -> frozenset[str]:
    """What a recipe may set: every setting that describes the experiment (plus where it was read from)."""
    return (known_keys() - RUN_CONTROL) | {"recipe_path"}


def merge(given: dict, defaults: dict) -> dict:
    """Given options over the recipe over the defaults (None means not given).

    Raises:
        ConfigError: the recipe sets something a recipe may not, or is for another source.
    """
    from sbcli.config.recipes import load_recipe

    recipe = load_recipe(given["recipe"], given.get("source")) if given.get("recipe") else {}
    unknown = sorted(set(recipe) - recipe_keys())
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


def build_options(given: dict, defaults: dict | None = None) -> tuple[SequenceOptions, RunOptions, Path | None]:
    """(SequenceOptions, RunOptions, out) from options by name; keys that are no setting are ignored.

    Args:
        given: the options given (None: not given), e.g. a command's parameters.
        defaults: below the recipe; None: :func:`defaults_for` the given source.

    Raises:
        ConfigError: a value is malformed (``--milestones``, ``--phase-epochs``) or refused.
    """
    o = merge(given, defaults_for(given.get("source")) if defaults is None else defaults)
    _balance_with_bic(o, given)
    method_options = {k: o.get(k) for k in sorted(method_keys())} | _phase_epochs(o.get("phase_epochs"))
    engine = {k: o[k] for k in engine_keys() if o.get(k) is not None}
    if "milestones" in engine:
        engine["milestones"] = _fractions(engine["milestones"])
    order_seed = None if o.get("order_seed") == -1 else o.get("order_seed")
    seq = SequenceOptions(source=o["source"], test=_str(o.get("test")), data_root=_str(o.get("data_root")),
                          download=bool(o.get("download", False)), image_size=o.get("image_size"),
                          tasks=None if o.get("base") else o.get("tasks"), base=o.get("base"),
                          increment=o.get("increment"), order_seed=order_seed, class_order=o.get("class_order"),
                          classes=o.get("classes"),
                          test_sample=bool(o.get("test_sample", True)) and not o.get("no_test_sample", False))
    run_fields = _fields(RunOptions) - {"train", "method_options"}
    run = RunOptions(method_options=method_options, train=TrainConfig(**engine),
                     **{k: o[k] for k in run_fields if o.get(k) is not None})
    return seq, run, None if o.get("out") is None else Path(o["out"])


def _balance_with_bic(o: dict, given: dict) -> None:
    """No balancing under BiC (:func:`sbcli.methods.balance.applies`): the default is dropped, an asked one refused."""
    from sbcli.methods import balance

    if balance.applies(o.get("inference")) or not o.get("balance_epochs"):
        return
    if given.get("balance_epochs"):
        raise ConfigError(balance.BIC_REFUSAL)
    o["balance_epochs"] = 0


def _phase_epochs(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    parts = [p.strip() for p in str(value).split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError("--phase-epochs takes three whole numbers A,B,C, e.g. 200,200,200.")
    return dict(zip(PHASE_EPOCHS, map(int, parts), strict=True))


def _fractions(value: Any) -> tuple[float, ...]:
    """``--milestones 0.3,0.6,0.8`` (or a recipe's list) as fractions of a phase's epochs."""
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        fractions = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        raise ConfigError(f"--milestones takes fractions of the epochs separated by commas, e.g. 0.3,0.6,0.8; "
                          f"got {value!r}.") from None
    if not all(0 < f <= 1 for f in fractions):
        raise ConfigError(f"--milestones are fractions of a phase's epochs, in (0, 1]; got {value!r}.")
    return fractions


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
