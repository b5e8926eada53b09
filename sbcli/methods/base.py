"""What a method is: a Config dataclass, ``learn_task(ctx, cfg) -> TaskResult``, its phase plan and its inference rules.

The engine owns the task loop (grow the head, call ``learn_task``, update the memory,
evaluate, save); a method owns only what differs, written as a short list of phases. Everything
that makes a method different lives in its one file: the options (the fields of its ``Config``,
each with its help as ``option(default, "help")``: `sb train` offers them, :mod:`sbcli.methods.options`),
how many epochs a later step trains (``plan``), and which inference rules it takes. A method
file imports torch inside its functions only, so that the CLI can read its options without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sbcli.errors import ConfigError
from sbcli.methods.rules import RULES, rules_help
from sbcli.methods.rules.rule import RuleOption
from sbcli.methods.rules.stages import StageReport
from sbcli.registry import Registry

if TYPE_CHECKING:  # a method file is read without torch (the CLI builds its options from the Config)
    import torch

    from sbcli.data.device import DeviceData
    from sbcli.engine.loop import Engine, PhaseReport
    from sbcli.metrics import StepMetrics
    from sbcli.nets.resnet import IncrementalResNet


@dataclass
class TaskContext:
    """Everything a method may use to learn one task.

    ``model`` already has its head grown to ``num_total`` classes; ``teacher`` is a frozen copy of
    the model after the previous step (None at step 0); ``data`` holds the new task's images plus
    the exemplars, on the device; ``evaluate`` measures the current model on the test images of
    every seen class (for the per-phase records of an ablation). ``extra`` is the method state
    the learner kept from the previous step (e.g. BiC's correction); ``memory_budget`` the total
    exemplar budget; ``seen_data`` returns the training images of every class seen so far, on the
    device, when the sequence has them (``api.train``), and is None when it does not (``add-task``).
    A method only trains: what ends the step under its rule (refresh, align, balance) the step's tail runs.
    """

    step: int
    model: IncrementalResNet
    teacher: IncrementalResNet | None
    data: DeviceData
    num_old: int
    num_total: int
    engine: Engine
    epochs: int
    evaluate: Callable[[], StepMetrics]
    make_aux_model: Callable[[int], IncrementalResNet] | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    memory_budget: int = 0
    seen_data: Callable[[], DeviceData] | None = None
    seed: int = 0  # the learner's --seed (what a method draws once, e.g. RanPAC's projection, depends on it alone)
    features: torch.Tensor | None = None  # pooled features [N, D] of ``data``'s rows, computed while streaming them

    @property
    def lam(self) -> float:
        """lambda = C_old / C_total."""
        return self.num_old / self.num_total


@dataclass
class TaskResult:
    """The phases a method ran and anything it wants kept in the learner's history.

    ``stages`` is filled by the step's tail (the reports of the rule's end-of-step stages, in the order they
    ran); ``accuracy_before_align`` False tells it that the method's ``record`` already holds the accuracy
    the align stage would measure before aligning (Split-and-Bridge's ``after_C``), so it measures none.
    """

    phases: list[PhaseReport] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    stages: list[StageReport] = field(default_factory=list)
    extra_state: dict[str, torch.Tensor] = field(default_factory=dict)
    accuracy_before_align: bool = True


Plan = Callable[[Any, int, int, int], int]  # (cfg, --epochs, C_old, C_total) -> epochs of a later step's own phases
FirstPlan = Callable[[Any, int], int]  # (cfg, --epochs) -> epochs of the first step


def one_phase(cfg: Any, epochs: int, num_old: int, num_total: int) -> int:
    """The plan of a method whose later steps train one phase of ``--epochs``."""
    return epochs


def first_task_epochs(cfg: Any, epochs: int) -> int:
    """The first step of a method that trains it for ``--epochs``."""
    return epochs


INFERENCE_HELP = rules_help()
FIRST_TASK_RULES_HELP = "Step 1 keeps the head bias at zero and clips negative head weights (the authors' code)."


def option(default: Any, help_text: str, default_text: str | None = None, together: str | None = None) -> Any:
    """A Config field that `sb train` offers as ``--NAME``, with its help.

    Args:
        default: the method's default.
        help_text: one sentence for the help (its default is stated after it).
        default_text: what the default means when it stands for something else (None: "--epochs").
        together: the name of one comma-separated option that gives this field with its neighbours of the
            same ``together`` (``--phase-epochs A,B,C`` for ``epochs_a``, ``epochs_b``, ``epochs_c``).
    """
    return field(default=default, metadata={"help": help_text, "default_text": default_text, "together": together})


def rule_option(owned: RuleOption) -> Any:
    """The Config field of an option a rule owns (:class:`RuleOption`): its name, default and help are the rule's."""
    return option(owned.default, owned.help)


def inference_option(default: str) -> Any:
    """The ``inference`` field of a method whose default rule is ``default`` (the first of its ``RULES``)."""
    return option(default, INFERENCE_HELP)


@dataclass(frozen=True)
class MethodConfig:
    """What every method's Config has: its inference rule (one of ``RULES``, the first the default) and
    step 1's head rules. A method's Config subclasses it, sets ``RULES`` and, when its default rule is
    not ``none``, redeclares ``inference`` with :func:`inference_option`; its own ``__post_init__``
    calls this one first."""

    RULES: ClassVar[tuple[str, ...]] = ("none",)  # the one place a method declares its rules
    METHOD: ClassVar[str] = ""  # the name it is registered under (set by register_method)
    inference: str = inference_option("none")
    first_task_rules: bool = option(True, FIRST_TASK_RULES_HELP)

    def __post_init__(self) -> None:
        if self.inference not in self.RULES:
            unknown = "" if self.inference in RULES.names() else " (no such rule)"
            offered = " or ".join(f"{name} ({RULES.get(name).summary})" for name in self.RULES)
            method = f"--method {self.METHOD}" if self.METHOD else "this method"
            raise ConfigError(f"--inference {self.inference}{unknown} is not available for {method}; choose {offered}.")
        chosen = RULES.get(self.inference).options
        for name in self.RULES:  # an option of another rule this method offers, given away from its default
            for owned in RULES.get(name).options:
                if owned.refusal and owned not in chosen and getattr(self, owned.name, owned.default) != owned.default:
                    raise ConfigError(owned.refusal)

    def needs_pixels(self) -> bool:
        """Whether a later step that trains nothing needs the new images' pixels and not only their pooled
        features (e.g. to flip them): then they are decoded whole rather than streamed."""
        return False


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its Config, its step, its one-line summary, its inference rules and its phase plan."""

    name: str
    config: type
    learn_task: Callable[[TaskContext, Any], TaskResult]
    summary: str
    inferences: tuple[str, ...] = ("none",)
    plan: Plan = one_phase
    title: str | None = None  # how a model card names it (None: its name)
    hub_tag: str | None = None  # its tag on the Hub (None: sbcli-NAME)
    first_plan: FirstPlan = first_task_epochs
    frozen_backbone: bool = False  # never trains the backbone after step 1: may take a timm architecture
    run_defaults: tuple[tuple[str, Any], ...] = ()  # run settings it sets when not given (e.g. no exemplars)
    streams: bool = False  # a step that trains nothing takes TaskContext.features (unless its Config needs_pixels())
    known_images: bool = False  # a later step may add images of classes already learned (an exact accumulation)
    any_backbone: bool = False  # trains the network whole, with no partition of sbcli's own: a timm architecture too

    @property
    def takes_timm(self) -> bool:
        """Whether ``--arch timm/NAME`` suits it: a frozen backbone, or one trained whole."""
        return self.frozen_backbone or self.any_backbone

    def balances(self, cfg: Any) -> bool:
        """Whether class-balanced fine-tuning may follow a later step under ``cfg``'s inference rule."""
        return RULES.get(cfg.inference).balance_refusal is None


METHODS: Registry[MethodSpec] = Registry("method")


def register_method(name: str, config: type, summary: str,
                    plan: Plan = one_phase, title: str | None = None, hub_tag: str | None = None,
                    first_plan: FirstPlan = first_task_epochs, frozen_backbone: bool = False,
                    run_defaults: tuple[tuple[str, Any], ...] = (), streams: bool = False,
                    known_images: bool = False, any_backbone: bool = False) -> Callable:
    """Decorator: register ``learn_task`` under ``name`` with its Config dataclass and plan (and how a model
    card names it, whether its backbone stays frozen or may be a timm network trained whole, run settings it
    defaults). Its inference rules are the Config's ``RULES``, declared there alone."""

    def add(fn: Callable[[TaskContext, Any], TaskResult]) -> Callable[[TaskContext, Any], TaskResult]:
        rules = getattr(config, "RULES", ("none",))
        if issubclass(config, MethodConfig):
            config.METHOD = name
        METHODS.register(name)(MethodSpec(name, config, fn, summary, rules, plan, title, hub_tag, first_plan,
                                          frozen_backbone, run_defaults, streams, known_images, any_backbone))
        return fn

    return add


def build_config(name: str, options: dict[str, Any]) -> Any:
    """The method's Config from options; ``None`` means unset (the method's default holds).

    Raises:
        ConfigError: an option that the method does not take, or a value it refuses.
    """
    spec = METHODS.get(name)
    known = {f.name for f in dataclasses.fields(spec.config)}
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - known)
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise ConfigError(f"{flags} does not apply to --method {name}; drop it or pick a method that takes it.")
    return spec.config(**given)  # a rule the method does not take: refused by its Config, in one sentence


def balance_epochs(name: str, options: Any, epochs: int, asked: bool) -> int:
    """The class-balanced fine-tuning epochs a learner of method ``name`` with ``options`` (its Config, or its
    options by name) runs: ``epochs``, or 0 where its inference rule takes none (a default dropped; an asked
    number refused).

    Raises:
        ConfigError: ``asked`` for a positive number under a rule that takes none.
    """
    cfg = options if dataclasses.is_dataclass(options) else build_config(name, options)
    if not epochs or METHODS.get(name).balances(cfg):
        return epochs
    if asked:
        raise ConfigError(RULES.get(cfg.inference).balance_refusal)
    return 0
