"""SimpleCIL: class prototypes on a frozen backbone, scored by cosine similarity (Zhou et al., IJCV 2024).

Each class's prototype is the mean of the L2-normalised pooled features of its training images
(with ``--prototype-flips``, of their horizontal flips too) under the backbone, which is never
trained after the first step. An image scores ``cos(f(x), p_c)`` for every class ``c``. Nothing of
an old class changes when a task is added: its prototype is carried over bit for bit, so the
method cannot forget, needs no exemplar memory (``--memory 0`` is its default) and ``sb add-task``
is one forward pass over the new images.

``--adapt-epochs N`` (APER, Zhou et al. 2024) first fine-tunes the backbone with cross-entropy on
the first task for N epochs, then freezes it; 0 (the default) keeps the backbone as it was built
or loaded (``--pretrained``, or a timm architecture's Hub weights).

Cosines lie in [-1, 1], so a softmax over them is nearly uniform whatever the ranking. Every step
therefore fits one scale ``s`` (:data:`SCALES`, 1 .. 128) minimising the negative log-likelihood of
``softmax(s * cos)`` over every seen prototype, on the step's images (its new classes', and the
exemplars' when ``--memory`` keeps some): each image of a new class is scored against its own class's
prototype without it (leave-one-out), as an image the prototype never saw would be. ``s`` is
positive, so predictions and accuracies do not change; the probabilities ``sb predict`` and
``sb serve`` report do.

The prototypes live in the learner as the ``simplecil.prototypes`` tensor [C_seen, D] (float32), the
scale as ``simplecil.scale`` [1] (float32; a learner saved before it has none and scores with 1); the
``prototype`` scoring module of :mod:`sbcli.methods.inference` turns them into one linear layer over
normalised features (the scale folded into its weight), which is what ``sb evaluate``, ``sb predict``,
``sb serve`` and the ONNX export compute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from sbcli.errors import ConfigError, LearnerError
from sbcli.methods.base import MethodConfig, TaskContext, TaskResult, inference_option, option, register_method
from sbcli.methods.rules.prototype import PROTOTYPES_KEY, SCALE_KEY  # the rule scores with what is kept under them

if TYPE_CHECKING:  # torch only inside the functions: the CLI reads this Config without it
    import torch

    from sbcli.engine.loop import Engine

INFERENCE = "prototype"
COUNTS = "simplecil.counts"  # [C] float64: the terms in each prototype (learners saved before have none)
BANK, BANK_TERMS, BANK_LABELS = "simplecil.bank", "simplecil.bank_terms", "simplecil.bank_labels"
BANK_PER_CLASS = 20  # normalised features kept per class, to fit the scale on every class seen
# softmax scales tried, in quarter octaves: 1 is the plain cosine; past 128 a cosine gap of 0.05 already
# separates the top two classes by e^6, more than one step's images can vouch for
SCALES = tuple(2.0 ** (k / 4) for k in range(29))
FIT_IMAGES = 20_000  # one number needs no more; the scores of N images take N x C x 8 bytes per candidate
ADAPT_HELP = "Fine-tune the backbone with CE on the first task for N epochs (APER), then freeze it (0: frozen as built or loaded)."


@dataclass(frozen=True)
class Config(MethodConfig):
    RULES: ClassVar[tuple[str, ...]] = (INFERENCE,)
    inference: str = inference_option(INFERENCE)
    adapt_epochs: int = option(0, ADAPT_HELP, default_text="0")
    prototype_flips: bool = option(False, "Class prototypes also over the horizontally flipped training images.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.adapt_epochs, int) or self.adapt_epochs < 0:
            raise ConfigError(f"--adapt-epochs {self.adapt_epochs} is not a count of epochs; give 0 (a frozen "
                              "backbone) or more.")

    def needs_pixels(self) -> bool:
        return self.prototype_flips  # the flipped images' features: a stream passes each image once, unflipped


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, classes: range) -> torch.Tensor:
    """Mean of the normalised ``features`` [N, D] of each class in ``classes`` -> [len(classes), D] float32.

    Raises:
        ConfigError: a class of ``classes`` has no image.
    """
    import torch
    from torch.nn import functional as F

    feats = F.normalize(features.float(), dim=1)
    index = labels.to(feats.device).long() - classes.start
    counts = torch.bincount(index, minlength=len(classes))
    if bool((counts == 0).any()):
        raise ConfigError(f"{int((counts == 0).sum())} new class(es) have no training image; give every class images.")
    sums = torch.zeros(len(classes), feats.shape[1], dtype=torch.float32, device=feats.device).index_add_(0, index, feats)
    return sums / counts[:, None]


def step_features(engine: Engine, model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                  classes: range, flips: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised features [N, D] of all the step's images (what scoring sees) and, for the images of
    ``classes`` only, the normalised terms [N_new, D] their prototypes average (flips included)."""
    from torch.nn import functional as F

    feats = F.normalize(engine.frozen_features(model, images), dim=1)
    new = ((labels >= classes.start) & (labels < classes.stop)).cpu()
    terms = feats[new]
    if flips:
        flipped = F.normalize(engine.frozen_features(model, images[new.to(images.device)].flip(-1)), dim=1)
        terms = F.normalize(terms + flipped, dim=1)
    return feats, terms


def fit_temperature(scores: torch.Tensor, labels: torch.Tensor, temperatures: tuple[float, ...]) -> float:
    """The T of ``temperatures`` for which softmax(scores / T) has the lowest NLL on ``labels``."""
    import torch

    nll = [float(torch.nn.functional.cross_entropy(scores.double() / t, labels.long())) for t in temperatures]
    return temperatures[min(range(len(nll)), key=nll.__getitem__)]


def held_out_cosines(feats: torch.Tensor, labels: torch.Tensor, protos: torch.Tensor, terms: torch.Tensor,
                     counts: torch.Tensor, classes: range) -> torch.Tensor:
    """Cosines [N, C] of the normalised ``feats`` to every prototype; an image of ``classes`` (its term the
    matching row of ``terms``; ``counts`` terms in each of these classes' prototypes) meets its own class's
    prototype without its own term (a class of one image keeps its prototype)."""
    import torch
    from torch.nn import functional as F

    scores = feats @ F.normalize(protos, dim=1).T
    rows = ((labels >= classes.start) & (labels < classes.stop)).nonzero().flatten()
    own = labels[rows].long()
    n = counts[own - classes.start]
    left = protos[own] * n[:, None] - terms  # the class's sum of terms without this image's
    loo = (feats[rows] * F.normalize(left, dim=1)).sum(1)
    scores[rows, own] = torch.where(n > 1, loo, scores[rows, own])
    return scores


def fit_scale(feats: torch.Tensor, labels: torch.Tensor, protos: torch.Tensor, terms: torch.Tensor,
              classes: range) -> float:
    """The scale of :data:`SCALES` whose softmax over held-out cosines has the lowest NLL (on at most about
    :data:`FIT_IMAGES` of the images, every k-th)."""
    import torch

    new = (labels >= classes.start) & (labels < classes.stop)
    counts = torch.bincount(labels[new].long() - classes.start, minlength=len(classes))
    stride = max(1, -(-len(labels) // FIT_IMAGES))
    pick = torch.arange(len(labels)) % stride == 0
    scores = held_out_cosines(feats[pick], labels[pick], protos, terms[pick[new]], counts, classes)
    return 1.0 / fit_temperature(scores, labels[pick], tuple(1.0 / s for s in SCALES))


def bank_rows(labels: torch.Tensor, per_class: int, seed: int, banked: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of up to ``per_class`` images of each class in ``labels`` (drawn by ``seed``), in label order; a
    class with rows in ``banked`` (the labels already in the bank) gets only what it lacks."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    picked = []
    for c in labels.unique():
        idx = (labels == c).nonzero().flatten()
        room = per_class - (0 if banked is None else int((banked == c).sum()))
        picked.append(idx[torch.randperm(len(idx), generator=gen)[:max(room, 0)]].sort().values)
    return torch.cat(picked) if picked else torch.zeros(0, dtype=torch.int64)


@dataclass(frozen=True)
class PrototypeState:
    """What the learner keeps between steps: the prototypes, the terms in each (None in a learner saved before
    they were counted) and the calibration bank: up to :data:`BANK_PER_CLASS` normalised features of each
    class's training images (and the terms they added to their prototype), features never images."""

    prototypes: torch.Tensor | None
    counts: torch.Tensor | None
    bank: torch.Tensor
    bank_terms: torch.Tensor
    bank_labels: torch.Tensor

    @classmethod
    def start(cls, prototypes: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> PrototypeState:
        import torch

        empty = torch.zeros(0, 0 if prototypes is None else prototypes.shape[1])
        return cls(prototypes, counts if prototypes is not None else torch.zeros(0, dtype=torch.float64), empty,
                   empty, torch.zeros(0, dtype=torch.int64))

    @classmethod
    def stored(cls, extra: dict[str, torch.Tensor], num_old: int) -> PrototypeState:
        """The state after the previous step (an empty one at the first).

        Raises:
            LearnerError: the prototypes, counts or bank do not fit the learner's classes.
        """
        old = stored_prototypes(extra, num_old)
        if old is None:
            return cls.start()
        counts, bank, terms, labels = extra.get(COUNTS), extra.get(BANK), extra.get(BANK_TERMS), extra.get(BANK_LABELS)
        if counts is not None and counts.shape != (num_old,):
            raise LearnerError(f"The learner knows {num_old} classes but counts the images of {counts.numel()}; it is "
                               "damaged: pull or copy it again.")
        if bank is None or labels is None:
            return cls.start(old, counts)
        terms = bank if terms is None else terms
        if (bank.dim() != 2 or bank.shape[1] != old.shape[1] or terms.shape != bank.shape
                or labels.shape != (bank.shape[0],) or bool(((labels < 0) | (labels >= num_old)).any())):
            raise LearnerError("The learner's calibration bank does not fit its classes; it is damaged: pull or copy "
                               "it again.")
        return cls(old, counts, bank, terms, labels)

    def tensors(self, flips: bool) -> dict[str, torch.Tensor]:
        out = {PROTOTYPES_KEY: self.prototypes.contiguous(), BANK: self.bank.contiguous(),
               BANK_LABELS: self.bank_labels.contiguous()}
        if flips:
            out[BANK_TERMS] = self.bank_terms.contiguous()
        if self.counts is not None:
            out[COUNTS] = self.counts
        return out


def fit_step(state: PrototypeState, feats: torch.Tensor, terms: torch.Tensor, labels: torch.Tensor,
             classes: range, seed: int) -> tuple[PrototypeState, float]:
    """The new classes' prototypes from their images' normalised features ``feats`` and ``terms`` (the same
    without flips), and the scale fitted on the calibration bank of every class seen, each bank image scored
    against its own class's prototype without its own term (leave-one-out)."""
    import torch

    new = class_prototypes(terms, labels, classes).cpu()
    protos = new if state.prototypes is None else torch.cat([state.prototypes, new])
    added = torch.bincount(labels.long() - classes.start, minlength=len(classes)).double()
    counts = None if state.counts is None else torch.cat([state.counts, added])
    rows = bank_rows(labels, BANK_PER_CLASS, seed)
    bank = torch.cat([state.bank.reshape(-1, feats.shape[1]), feats[rows].float()])
    bank_terms = torch.cat([state.bank_terms.reshape(-1, feats.shape[1]), terms[rows].float()])
    bank_labels = torch.cat([state.bank_labels, labels[rows].long()])
    known = torch.cat([torch.zeros(classes.start, dtype=torch.float64), added]) if counts is None else counts
    scores = held_out_cosines(bank, bank_labels, protos.float(), bank_terms, known.float(), range(0, classes.stop))
    scale = 1.0 / fit_temperature(scores, bank_labels, tuple(1.0 / s for s in SCALES))
    return PrototypeState(protos, counts, bank, bank_terms, bank_labels), scale


def stored_prototypes(extra: dict[str, torch.Tensor], num_old: int) -> torch.Tensor | None:
    """The old classes' prototypes from the learner's state (None at the first step).

    Raises:
        LearnerError: the learner has old classes but no prototype for each of them.
    """
    if num_old == 0:
        return None
    old = extra.get(PROTOTYPES_KEY)
    if old is None or old.shape[0] != num_old:
        have = "none" if old is None else f"{old.shape[0]}"
        raise LearnerError(f"The learner knows {num_old} classes but holds {have} class prototypes; it is damaged "
                           "or was not trained with --method simplecil.")
    return old


def adapt(ctx: TaskContext, cfg: Config) -> list:
    """APER's adaptation: CE on the first task's images for ``adapt_epochs`` epochs (none: no phase).

    ``cfg`` is any frozen-backbone method's Config with ``adapt_epochs`` and ``first_task_rules``."""
    if ctx.step > 0 or cfg.adapt_epochs == 0:
        return []
    from sbcli.engine.loop import Phase
    from sbcli.methods.first_task import head_rules_phase
    from sbcli.methods.losses import ce

    phase = head_rules_phase(ctx.model, Phase("adapt", ce, cfg.adapt_epochs), cfg.first_task_rules)
    return [ctx.engine.run(ctx.model, ctx.data, phase)]


def _no_training(cfg: Config, epochs: int, num_old: int, num_total: int) -> int:
    """A later step trains nothing: it computes the new classes' prototypes."""
    return 0


def adapt_epochs(cfg: Config, epochs: int) -> int:
    """The first step trains only its adaptation epochs (none by default)."""
    return cfg.adapt_epochs


@register_method("simplecil", Config, "prototypes on a frozen backbone, cosine scores (no training, no exemplars)",
                 plan=_no_training, first_plan=adapt_epochs, frozen_backbone=True,
                 run_defaults=(("memory", 0),), streams=True, title="SimpleCIL: class prototypes on a frozen backbone (Zhou et al., IJCV 2024)")
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    import torch

    state = PrototypeState.stored(ctx.extra, ctx.num_old)
    phases = adapt(ctx, cfg)
    start = time.perf_counter()
    classes = range(ctx.num_old, ctx.num_total)
    labels = ctx.data.labels.cpu()
    if ctx.features is not None:  # streamed (sbcli.data.stream): no exemplars, no flips, every image a new class's
        feats = torch.nn.functional.normalize(ctx.features.float(), dim=1)
        terms = feats
    else:
        feats, terms = step_features(ctx.engine, ctx.model, ctx.data.images, labels, classes, cfg.prototype_flips)
    new = labels >= ctx.num_old  # exemplars, if any were asked for, are not seen twice
    state, scale = fit_step(state, feats[new].cpu(), terms.cpu(), labels[new], classes, ctx.seed * 1000 + ctx.step)
    record = {"prototypes_from": len(terms), "flips": cfg.prototype_flips, "scale": scale,
              "calibrated_on": len(state.bank_labels), "prototype_seconds": round(time.perf_counter() - start, 3)}
    extra = {**state.tensors(cfg.prototype_flips), SCALE_KEY: torch.tensor([scale], dtype=torch.float32)}
    return TaskResult(phases=phases, record=record, extra_state=extra)
