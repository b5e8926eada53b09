"""What a run uses when an option is not given: one table, read by the runs and by the help.

Each row is a setting (named as its field and its option: ``batch_size`` is ``--batch-size``) and
the value it takes from each source when nothing sets it:

- ``value``: a paper benchmark (cifar10, cifar100, tiny-imagenet), every cell of ``sb bench``, and
  the dataclasses a notebook builds by hand (:class:`sbcli.engine.loop.TrainConfig`,
  :class:`sbcli.config.options.RunOptions`), which take their defaults from here;
- ``demo``: the bundled demo, a CPU-sized budget so that ``sb train`` alone ends in a few minutes
  (``sb train`` and ``sb bench``; measured: docs/lab/benchmarks.md, "The demo's budget");
- ``folder``: a class-per-folder directory given to ``sb train`` (own data: defaults measured on held-out
  classes, docs/lab/benchmarks.md "Own-data defaults");
- ``own``: own data in ``sb train``, a folder or the demo (not a paper benchmark, not ``sb bench``);
- ``train``: every source of ``sb train`` (the own-data additions measured in docs/lab/benchmarks.md:
  warm-up on, class-balanced fine-tuning on), which ``sb bench`` and the paper recipes leave out.

A source's own column comes before ``own``, then ``train``, then ``value``. ``text`` says what a
sentinel value means (``incremental_lr``: None is "--lr"). The help of every option states its
default from this table (:func:`describe`), per source where they differ, and
``tests/test_defaults.py`` checks each statement against what a run uses.

Torch-free: the CLI reads it at import to write its help.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sbcli.source_kinds import PAPER_BENCHMARKS

Command = Literal["train", "bench"]
Kind = Literal["folder", "demo", "paper"]

# `sb bench`'s rows by default: the paper's Table 1, in its order (sbcli.bench.grid registers each row)
PAPER_ORDER = ("finetune", "std-icarl", "std-bic", "std-wa", "dd-wa", "sb-wa", "joint")


class _Unset:
    """A column that says nothing: the next one holds."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Default:
    """One setting's default per source (see the module docstring for the columns)."""

    value: Any
    demo: Any = UNSET
    folder: Any = UNSET
    own: Any = UNSET  # `sb train` on own data: a folder or the demo
    train: Any = UNSET
    text: str | None = None  # what ``value`` means when it stands for something else (None, 0)

    def resolve(self, command: Command, kind: Kind) -> Any:
        """The value for ``kind`` of source in ``command`` (`sb bench` runs folders on the paper's budget)."""
        for column, applies in (("demo", kind == "demo"), ("folder", kind == "folder" and command == "train"),
                                ("own", kind in ("folder", "demo") and command == "train"), ("train", command == "train")):
            if applies and getattr(self, column) is not UNSET:
                return getattr(self, column)
        return self.value


# The table. A value changes here and nowhere else (the help follows).
DEFAULTS: dict[str, Default] = {
    # what runs. A folder's column is its run from scratch (--pretrained none): STD + WA (at the same epochs a step
    # S&B + WA was 7 points behind on held-out classes, 3 seeds). With no backbone, method or recipe asked, a folder
    # starts from EfficientNet-Lite0 under the ridge head instead (sbcli.config.options, FOLDER_BACKBONE).
    "method": Default("sb", folder="std"),
    "arch": Default("resnet18"),
    "width": Default(1.0, demo=0.25),
    "tasks": Default(10, demo=5, folder=1),
    "order_seed": Default(0),
    "seed": Default(0),
    # the budget
    "epochs": Default(200, demo=8, folder=30),  # every phase: a fresh optimiser
    "batch_size": Default(256, demo=64, folder=128),
    "memory": Default(2000, demo=200),
    "selection": Default("random"),
    # the optimiser and its schedule (the authors' code)
    # a folder: 0.1 lost 16.7 points over 4 steps at 10 epochs a step (3 seeds) and 13.5 at 30 (2 seeds; docs/lab/benchmarks.md)
    "lr": Default(0.1, folder=0.01),
    "momentum": Default(0.9),
    "nesterov": Default(True),
    "weight_decay": Default(5e-4),
    "milestones": Default((0.3, 0.6, 0.8)),  # 60/120/160 of 200 epochs
    "lr_decay": Default(0.1),
    "drop_last": Default(True),
    "warmup_epochs": Default(0.0, train=1.0, folder=0.0),  # in `sb train`: 1 at --lr 0.05 and above, 0 below
    "zero_init_residual": Default(False),  # measured harmful on the demo's first task (docs/lab/benchmarks.md)
    "incremental_lr": Default(None, text="--lr"),
    "val_fraction": Default(0.0),
    "val_every": Default(0, text="a fifth of the phase"),
    # the demo gains (+19 points at its last step); a folder under --wa-clip lost 0.7 to 2.2 points (3 seeds)
    "balance_epochs": Default(0, train=2, folder=0),
    "balance_lr": Default(0.01),
    "balance_before_wa": Default(False),  # the authors' order: weight aligning ends the method's step, balancing follows
    # method options whose own-data default differs from the method's (the paper's)
    "wa_clip": Default(False, own=True),  # kept the old classes' head rows (docs/lab/benchmarks.md, "Own-data defaults")
    # how fast and where (no effect on results)
    "eval_batch_size": Default(1024),
    "threads": Default(None, text="the cores that other running work leaves free"),
    "compile": Default(False),
    "cuda_graphs": Default(True),
    "precision": Default("auto"),
    "device": Default("auto"),
}

# `sb bench`'s columns: the task counts of the grid.
BENCH_TASKS = Default("2,5,10,20", demo="2,5")


def kind_of(source: str | None) -> Kind:
    """The demo (no source), a paper benchmark by name, or anything else (a folder, a zip): a folder."""
    if source in (None, "demo"):
        return "demo"
    return "paper" if source in PAPER_BENCHMARKS else "folder"


def base(name: str) -> Any:
    """The value a dataclass built by hand takes (the ``value`` column)."""
    return DEFAULTS[name].value


def defaults(command: Command, source: str | None) -> dict[str, Any]:
    """Every setting of the table as ``command`` uses it for ``source``."""
    kind = kind_of(source)
    return {name: row.resolve(command, kind) for name, row in DEFAULTS.items()}


def show(value: Any) -> str:
    """A default as the help writes it: on/off, 0.1, 5e-4, 0.3,0.6,0.8."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return ",".join(show(v) for v in value)
    return str(value)


KIND_WORDS = {"folder": "folders", "demo": "the demo", "paper": "paper benchmarks"}
COMMAND_KINDS: dict[str, tuple[Kind, ...]] = {"train": ("folder", "demo", "paper"), "bench": ("paper", "demo")}


def statement(row: Default, command: Command, show_value: Callable[[Any], str] = show) -> str:
    """``30 for folders, 8 for the demo, 200 for paper benchmarks``, or one value when every source agrees."""
    kinds = COMMAND_KINDS[command]
    values = {kind: row.resolve(command, kind) for kind in kinds}
    words = {kind: row.text if row.text is not None and v == row.value else show_value(v) for kind, v in values.items()}
    if len(set(words.values())) == 1:
        return words[kinds[0]]
    if command == "bench":  # the paper's budget but for the demo
        return f"{words['paper']}; {words['demo']} for the demo"
    groups: dict[str, list[str]] = {}
    for kind in kinds:
        groups.setdefault(words[kind], []).append(KIND_WORDS[kind])
    return ", ".join(f"{word} for {' and '.join(names)}" for word, names in groups.items())


def describe(help_text: str, name: str, command: Command) -> str:
    """``help_text`` followed by the default of ``name`` in ``command``, as the table says."""
    return f"{help_text.rstrip('.')} (default: {statement(DEFAULTS[name], command)})."


def markdown() -> str:
    """The table as docs/cli.md shows it: one row per setting, one column per source and `sb bench`."""
    lines = ["| setting | folder | demo | paper benchmark | `sb bench` |", "|---|---|---|---|---|"]
    for name, row in DEFAULTS.items():
        cells = [row.resolve("train", kind) for kind in ("folder", "demo", "paper")]
        bench = statement(BENCH_TASKS if name == "tasks" else row, "bench")
        words = [row.text if row.text is not None and v == row.value else show(v) for v in cells]
        lines.append(f"| `--{name.replace('_', '-')}` | " + " | ".join(words) + f" | {bench} |")
    return "\n".join(lines)
