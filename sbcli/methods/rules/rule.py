"""What an inference rule is: how a learner turns its network into scores over every class seen.

Rules are a second axis beside methods (a method says which rules it takes, ``Config.RULES``, and nowhere
else). A rule several methods share is one file of this package; a method with a rule of its own may register
it in the method's file (one new file and its import line in :mod:`sbcli.methods`). Each registers one
:class:`InferenceRule`: its help, the text a model card gives it, whether class-balanced fine-tuning may
follow it, whether the first task's head rules are on by default under it, how it scores (a builder of one
scoring module, or the network's own logits) and the options it owns (:class:`RuleOption`). The files import
torch only inside their builders, so that the command line reads the rules (``--inference`` and its help)
without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sbcli.methods.rules.stages import STAGES
from sbcli.registry import Registry

ScoringBuilder = Callable[[Any, dict], Any]  # (network, the learner's extra tensors) -> nn.Module: images -> scores
StateRefresh = Callable[..., dict]  # (network, exemplar images, labels, feature fn, method Config) -> extra tensors
Aligner = Callable[..., Any]  # (network, C_old, the step's accuracy before or None) -> AlignReport


@dataclass(frozen=True)
class RuleOption:
    """An option that belongs to one rule: a method that offers the rule declares it as a field of its Config
    (``rule_option`` in :mod:`sbcli.methods.base`), under ``name``, so ``sb train`` offers ``--NAME`` and the
    learner keeps it where it always has.

    Attributes:
        name: the Config field (``wa_clip``: ``--wa-clip``).
        default: its value when not given.
        help: one sentence for the option's help.
        refusal: why a value other than the default is refused under another rule (None: it is not).
    """

    name: str
    default: Any
    help: str
    refusal: str | None = None


@dataclass(frozen=True)
class InferenceRule:
    """One inference rule.

    Attributes:
        name: what ``--inference`` takes.
        summary: a few words for the option's help ("weight aligning").
        card: what a model card says the exported model computes.
        align: the align stage a step under this rule ends with, run by the step's tail after the method's
            phases (None: it has none; ``--wa-clip`` and ``--balance-before-wa`` go with one alone).
        balance_refusal: why class-balanced fine-tuning may not follow a step under this rule (None: it may).
        clamps_first_task: under own-data defaults, step 1's head rules are on (False where the rule's
            reference code never clamps the head: iCaRL, BiC).
        needs_memory: the rule is fitted on exemplars of every class (a memory below one per class is refused).
        scoring: the builder of its scoring module; None: the network's logits are the scores.
        refresh: its state rebuilt after every memory update (None: it keeps none that depends on the memory).
        options: the options it owns (:class:`RuleOption`).
    """

    name: str
    summary: str
    card: str
    balance_refusal: str | None = None
    clamps_first_task: bool = True
    needs_memory: bool = False
    scoring: ScoringBuilder | None = None
    refresh: StateRefresh | None = None
    offered: bool = True  # named in --inference's help (False: a rule no method offers on its own, kept for its scoring)
    options: tuple[RuleOption, ...] = ()
    align: Aligner | None = None

    @property
    def aligns(self) -> bool:
        """A step under this rule ends by aligning the head (:attr:`align`)."""
        return self.align is not None

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages that end a step under this rule, in the order they run (:data:`stages.STAGES`): refresh
        (its state rebuilt from the memory), align (the new classes' head rows aligned), balance (class-balanced
        fine-tuning, where it may follow; ``--balance-before-wa`` runs it before the align stage)."""
        on = {"refresh": self.refresh is not None, "balance": self.balance_refusal is None, "align": self.aligns}
        return tuple(stage for stage in STAGES if on[stage])


RULES: Registry[InferenceRule] = Registry("inference rule")


def register_rule(rule: InferenceRule) -> InferenceRule:
    """Add ``rule`` under its name (a name registered twice is an error)."""
    RULES.register(rule.name)(rule)
    return rule
