"""RanPAC: a ridge-regression head on a frozen backbone's randomly projected features (McDonnell et al., NeurIPS 2023).

Each image's pooled feature ``f`` [D] goes through a fixed random projection and a ReLU,
``h = relu(f W_rand)`` [M] (``--projection M``; 0: the features themselves, a plain ridge head).
Every step adds its images to two running sums, in float64,

    G += H^T H      (M x M)        Q += H^T Y      (M x C, Y one-hot)

and the head is the ridge solution ``W = (G + lambda I)^-1 Q`` (by Cholesky). Because G and Q are
sums, the head after any number of steps is exactly the joint ridge regression on every image seen,
with no exemplar kept: nothing is forgotten, and ``sb add-task`` is one forward pass over the new
images and one M x M solve. ``lambda`` (``--ridge``; default: chosen) is picked at every step on a
held-back fifth of the new images (at most 2,000; the grid RanPAC uses, 1e-8 .. 1e14, lowest squared
error), then the head is solved on all of them, its sums added 4,096 images at a time (so that memory
does not grow with the number of images). The scores are then scaled by one temperature fitted on the
calibration bank of every class seen (lowest negative log-likelihood; up to :data:`BANK_PER_CLASS`
features a class, each scored by exact leave-one-out), so that the probabilities a user reads from
``sb predict`` mean what they say at any length of the sequence: the ridge scores themselves sit near
0 and 1, where a softmax is nearly uniform. ``--inference lda`` solves a shared-covariance discriminant
from the same sums and the class counts instead (:mod:`sbcli.methods.rules.lda`).

The learner keeps ``ranpac.projection`` [D, M] (float32; drawn once from ``--seed``), ``ranpac.gram``
(G, its lower triangle: :func:`pack_gram`) and ``ranpac.targets`` (Q) in float64, and ``ranpac.head`` [C, M] (float32, the temperature folded
in): the ``ridge`` scoring module of :mod:`sbcli.methods.inference` is the backbone, one MatMul, a ReLU
and one MatMul, which is what ``sb evaluate``, ``sb predict``, ``sb serve`` and the ONNX export compute.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from sbcli.errors import ConfigError, LearnerError
from sbcli.methods.base import MethodConfig, TaskContext, TaskResult, inference_option, option, register_method
from sbcli.methods.rules import lda, score_map
from sbcli.methods.rules.ridge import HEAD_KEY, PROJECTION_KEY
from sbcli.methods.simplecil import ADAPT_HELP, adapt, adapt_epochs, bank_rows, fit_temperature

if TYPE_CHECKING:  # torch only inside the functions: the CLI reads this Config without it
    import torch

INFERENCE = "ridge"
GRAM, TARGETS = "ranpac.gram", "ranpac.targets"
COUNTS = "ranpac.counts"  # [C] float64: images of each class in the sums (learners saved before have none)
BANK, BANK_LABELS = "ranpac.bank", "ranpac.bank_labels"  # [K, D] float32 features, [K] int64: the calibration bank
RIDGE_GRID = tuple(10.0**k for k in range(-8, 15))  # RanPAC's candidates
HELD_BACK = 0.2  # of each step's new images, to choose lambda (and the LDA's shrinkage)
BANK_PER_CLASS = 20  # backbone features kept per class, to fit the temperature on every class seen
TEMPERATURES = tuple(2.0 ** (k / 4) for k in range(-24, 45))  # 1/64 .. 2048 in quarter octaves
MAX_PROJECTION = 20_000  # G alone is M * M * 8 bytes: 3.2 GB at 20,000
ROWS = 4096  # images projected at a time into the sums (H of 4,096 x 2,000 float64: 66 MB)
MAX_HELD_BACK = 2000  # held-back images at most (kept projected to choose lambda and the temperature)


@dataclass(frozen=True)
class Config(MethodConfig):
    RULES: ClassVar[tuple[str, ...]] = (INFERENCE, "lda")
    inference: str = inference_option(INFERENCE)
    projection: int = option(2000, "Size of the random projection before the ridge head (0: none, the backbone's "
                                   "features themselves; its Gram matrix takes M x M x 8 bytes).", default_text="2000")
    ridge: float | None = option(None, "The ridge strength lambda (default: chosen at every step on a held-back "
                                       "fifth of the new images).", default_text="chosen")
    adapt_epochs: int = option(0, ADAPT_HELP, default_text="0")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.projection, int) or not 0 <= self.projection <= MAX_PROJECTION:
            raise ConfigError(f"--projection {self.projection} is outside 0..{MAX_PROJECTION}; give e.g. 2000 "
                              "(0: no projection).")
        if self.ridge is not None and not 0 < self.ridge < 1e300:
            raise ConfigError(f"--ridge {self.ridge} is not a positive strength; give e.g. 1000, or leave it out "
                              "to choose it on held-back images.")
        if not isinstance(self.adapt_epochs, int) or self.adapt_epochs < 0:
            raise ConfigError(f"--adapt-epochs {self.adapt_epochs} is not a count of epochs; give 0 (a frozen "
                              "backbone) or more.")
        if self.ridge is not None and self.inference == "lda":
            raise ConfigError("--ridge is the ridge head's strength; --inference lda chooses its own shrinkage on "
                              "held-back images: drop --ridge.")


# -- the equations ------------------------------------------------------------------------------


def random_projection(features: int, size: int, seed: int) -> torch.Tensor:
    """W_rand [D, M]: standard normal entries from its own generator (the same on every machine)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randn(features, size, generator=gen, dtype=torch.float32)


def project(features: torch.Tensor, projection: torch.Tensor | None) -> torch.Tensor:
    """h = relu(f W_rand) in float64 (the features themselves without a projection)."""
    import torch

    f = features.double()
    return f if projection is None else torch.relu(f @ projection.double())


def accumulate(gram: torch.Tensor, targets: torch.Tensor, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """G + H^T H and Q + H^T Y.

    H^T H is made symmetric to the bit from its lower triangle (a matrix product may round its two
    triangles differently), so that G kept as its lower triangle (:func:`pack_gram`) is G itself.
    """
    hh = h.T @ h
    return gram + (hh.tril() + hh.tril(-1).T), targets + h.T @ y


def solve_ridge(gram: torch.Tensor, targets: torch.Tensor, ridge: float) -> torch.Tensor:
    """W = (G + lambda I)^-1 Q [M, C], by Cholesky.

    Raises:
        ConfigError: G + lambda I is not positive definite (lambda far too small for these features).
    """
    import torch

    eye = torch.eye(gram.shape[0], dtype=gram.dtype)
    factor, info = torch.linalg.cholesky_ex(gram + ridge * eye)
    if int(info) != 0:
        raise ConfigError(f"The ridge system is not positive definite at --ridge {ridge:g}; give a larger --ridge "
                          "or leave it out to choose it.")
    return torch.cholesky_solve(targets, factor)


def one_hot(labels: torch.Tensor, classes: int) -> torch.Tensor:
    import torch

    return torch.nn.functional.one_hot(labels.long(), classes).double()


def held_back_error(gram: torch.Tensor, targets: torch.Tensor, held_h: torch.Tensor, held_y: torch.Tensor,
                    ridge: float) -> float:
    """Mean squared error on the held-back images of the head solved at ``ridge`` (one Cholesky); infinite
    where ``G + lambda I`` is not numerically positive definite (lambda too small to mean anything)."""
    import torch

    factor, info = torch.linalg.cholesky_ex(gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype))
    if int(info) != 0:
        return float("inf")
    return float(((held_h @ torch.cholesky_solve(targets, factor) - held_y) ** 2).mean())


def choose_ridge(gram: torch.Tensor, targets: torch.Tensor, held_h: torch.Tensor, held_y: torch.Tensor) -> float:
    """The lambda of :data:`RIDGE_GRID` whose head (on ``gram``/``targets``) has the lowest squared error on
    the held-back images, found coarse to fine: every third candidate, then the two on each side of the
    best (12 Cholesky factorisations of M x M where the whole grid takes 23; on a 2-core CPU an
    eigendecomposition of G costs as much as about 80 of them)."""
    errors: dict[int, float] = {}

    def error(i: int) -> float:
        if i not in errors:
            errors[i] = held_back_error(gram, targets, held_h, held_y, RIDGE_GRID[i])
        return errors[i]

    best = min(range(0, len(RIDGE_GRID), 3), key=error)
    best = min((i for i in range(best - 2, best + 3) if 0 <= i < len(RIDGE_GRID)), key=error)
    return RIDGE_GRID[best]


def held_back_split(labels: torch.Tensor, fraction: float, seed: int, limit: int | None = None) -> torch.Tensor:
    """A boolean mask of about ``fraction`` of each class's images (at least one left to fit on), at most
    ``limit`` in all (shared evenly by the classes): what is held back is kept projected in memory."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    held = torch.zeros(len(labels), dtype=torch.bool)
    classes = labels.unique()
    per_class = None if limit is None else max(1, limit // max(1, len(classes)))
    for c in classes:
        idx = (labels == c).nonzero().flatten()
        take = min(int(len(idx) * fraction), len(idx) - 1)
        if per_class is not None:
            take = min(take, per_class)
        held[idx[torch.randperm(len(idx), generator=gen)[:take]]] = True
    return held


def accumulate_rows(gram: torch.Tensor, targets: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                    classes: int, projection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """G + H^T H and Q + H^T Y over ``features`` projected :data:`ROWS` at a time: the memory taken is one
    chunk's H, whatever the number of images (one chunk, and the same bits as one product, up to ROWS).

    Under torchrun each rank adds its own shard of the rows (:func:`sbcli.engine.distributed.shard_range`)
    and ``all_reduce`` sums the ranks' sums: the same G and Q as one process, up to float64's order of
    summation.
    """
    import torch

    from sbcli.engine import distributed

    group = distributed.info()
    if group.enabled:
        lo, hi = distributed.shard_range(len(features), group)
        local = _accumulate_chunks(torch.zeros_like(gram), torch.zeros_like(targets), features[lo:hi], labels[lo:hi],
                                   classes, projection)
        return gram + distributed.all_reduce_sum(local[0], group), targets + distributed.all_reduce_sum(local[1], group)
    return _accumulate_chunks(gram, targets, features, labels, classes, projection)


def _accumulate_chunks(gram: torch.Tensor, targets: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                       classes: int, projection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    for start in range(0, len(features), ROWS):
        h = project(features[start:start + ROWS], projection)
        gram, targets = accumulate(gram, targets, h, one_hot(labels[start:start + ROWS], classes))
    return gram, targets


# -- one step -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RidgeState:
    """What the learner keeps between steps: the projection, the running sums, the images of each class in them
    (None in a learner saved before they were counted) and the calibration bank: up to
    :data:`BANK_PER_CLASS` backbone features of each class's training images (features, never images)."""

    projection: torch.Tensor | None
    gram: torch.Tensor
    targets: torch.Tensor
    counts: torch.Tensor | None = None
    bank: torch.Tensor | None = None
    bank_labels: torch.Tensor | None = None

    @classmethod
    def start(cls, features: int, cfg: Config, seed: int) -> RidgeState:
        import torch

        projection = random_projection(features, cfg.projection, seed) if cfg.projection else None
        size = cfg.projection or features
        return cls(projection, torch.zeros(size, size, dtype=torch.float64), torch.zeros(size, 0, dtype=torch.float64),
                   torch.zeros(0, dtype=torch.float64), torch.zeros(0, features), torch.zeros(0, dtype=torch.int64))

    @classmethod
    def stored(cls, extra: dict[str, torch.Tensor], num_old: int) -> RidgeState:
        """The state after the previous step.

        Raises:
            LearnerError: the learner's ridge tensors are missing or do not fit each other.
        """
        gram, targets = extra.get(GRAM), extra.get(TARGETS)
        if gram is None or targets is None or targets.shape[1] != num_old or not _fits(gram, targets.shape[0]):
            raise LearnerError(f"The learner knows {num_old} classes but its ridge head's sums do not fit them; "
                               "it is damaged or was not trained with --method ranpac.")
        counts, bank, bank_labels = extra.get(COUNTS), extra.get(BANK), extra.get(BANK_LABELS)
        if counts is not None and counts.shape != (num_old,):
            raise LearnerError(f"The learner knows {num_old} classes but counts images of {counts.numel()}; it is "
                               "damaged: pull or copy it again.")
        if (bank is None) != (bank_labels is None) or (bank is not None and (
                bank.dim() != 2 or bank_labels.shape != (bank.shape[0],)
                or bool(((bank_labels < 0) | (bank_labels >= num_old)).any()))):
            raise LearnerError("The learner's calibration bank does not fit its classes; it is damaged: pull or copy "
                               "it again.")
        return cls(extra.get(PROJECTION_KEY), unpack_gram(gram, targets.shape[0]), targets, counts, bank, bank_labels)

    def grown(self, classes: int) -> RidgeState:
        """Q (and the counts) with zeros for the new classes (no image of them yet)."""
        import torch

        pad = torch.zeros(self.targets.shape[0], classes - self.targets.shape[1], dtype=torch.float64)
        counts = None if self.counts is None else torch.cat([self.counts, torch.zeros(classes - len(self.counts),
                                                                                         dtype=torch.float64)])
        return dataclasses.replace(self, targets=torch.cat([self.targets, pad], dim=1), counts=counts)

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a step saves of this state (besides the head)."""
        out = {GRAM: pack_gram(self.gram), TARGETS: self.targets}
        if self.projection is not None:
            out[PROJECTION_KEY] = self.projection
        if self.counts is not None:
            out[COUNTS] = self.counts
        if self.bank is not None:
            out[BANK], out[BANK_LABELS] = self.bank.float().contiguous(), self.bank_labels.long().contiguous()
        return out


def ridge_held_out_scores(h: torch.Tensor, y: torch.Tensor, gram: torch.Tensor, targets: torch.Tensor,
                          ridge: float) -> torch.Tensor:
    """Scores [K, C] of rows ``h`` (one-hot ``y``), each counted in the sums, as the head solved without that row
    would give them: exact leave-one-out for a ridge regression, ``y - (y - s) / (1 - h A^-1 h^T)`` with
    ``A = G + lambda I`` and ``s`` the row's scores."""
    import torch

    chol = torch.linalg.cholesky(gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype))
    scores = h @ torch.cholesky_solve(targets, chol)
    leverage = (h * torch.cholesky_solve(h.T.contiguous(), chol).T).sum(1).clamp(max=1 - 1e-9)
    return y - (y - scores) / (1 - leverage)[:, None]


def choose_shrinkage(gram: torch.Tensor, targets: torch.Tensor, counts: torch.Tensor, held_h: torch.Tensor,
                     held_labels: torch.Tensor) -> float:
    """The shrinkage of :data:`lda.SHRINKAGES` whose discriminant (on the sums) has the lowest negative
    log-likelihood on the held-back images at its best temperature."""
    import torch

    best, best_nll = lda.SHRINKAGES[-1], float("inf")
    for a in lda.SHRINKAGES:
        try:
            w, b = lda.solve_lda(gram, targets, counts, a)
        except ValueError:
            continue
        scores = held_h @ w + b
        t = fit_temperature(scores, held_labels, TEMPERATURES)
        nll = float(torch.nn.functional.cross_entropy(scores / t, held_labels.long()))
        if nll < best_nll:
            best, best_nll = a, nll
    return best


def fit_step(state: RidgeState, features: torch.Tensor, labels: torch.Tensor, classes: int, ridge: float | None,
             seed: int, head: str = INFERENCE) -> tuple[RidgeState, torch.Tensor, dict]:
    """Add one step's images to the sums and solve the head (``ridge``, or ``lda``: :mod:`sbcli.methods.rules.lda`).

    The ridge strength (or the LDA's shrinkage) is chosen on a held-back fifth of the new images; the
    temperature on the calibration bank, which holds up to :data:`BANK_PER_CLASS` images of every class seen,
    each scored as if it had been left out of the fit (exact for the ridge head; for the LDA, left out of its
    class's mean), then an increasing map of the tempered scores on the same bank
    (:mod:`sbcli.methods.rules.score_map`). A learner saved before the bank keeps its old classes out of it.

    Returns:
        the new state, the head [C, M] in float32 (temperature folded in) and, under ``lda``, its bias in
        ``chosen["bias"]`` [C], and what was chosen, with the map of the tempered scores
        (:mod:`sbcli.methods.rules.score_map`: its tensors under its two keys, its number of knots as ``score_map``).
    """
    import torch

    state = state.grown(classes)
    held = held_back_split(labels, HELD_BACK, seed, MAX_HELD_BACK)
    added = torch.bincount(labels.long(), minlength=classes).double()
    counts = None if state.counts is None else state.counts + added
    if head == "lda" and counts is None:
        raise LearnerError("This learner was saved before its ridge sums counted images per class, which an LDA head "
                           "needs; grow it with --inference ridge.")
    chosen: float | None = None if head == "lda" else ridge  # --ridge is the ridge head's strength alone
    if held.any() and chosen is None:
        fit_g, fit_q = accumulate_rows(state.gram, state.targets, features[~held], labels[~held], classes,
                                       state.projection)
        held_h = project(features[held], state.projection)
        if head == "lda":
            fit_n = state.counts + torch.bincount(labels[~held].long(), minlength=classes).double()
            chosen = choose_shrinkage(fit_g, fit_q, fit_n, held_h, labels[held])
        else:
            chosen = choose_ridge(fit_g, fit_q, held_h, one_hot(labels[held], classes))
    chosen = chosen if chosen is not None else (lda.SHRINKAGES[-1] if head == "lda" else 1.0)
    gram, targets = accumulate_rows(state.gram, state.targets, features, labels, classes, state.projection)
    new_rows = bank_rows(labels, BANK_PER_CLASS, seed, state.bank_labels)
    bank = features[new_rows].float() if state.bank is None else torch.cat([state.bank, features[new_rows].float()])
    bank_labels = labels[new_rows].long() if state.bank_labels is None else torch.cat([state.bank_labels,
                                                                                       labels[new_rows].long()])
    bank_h = project(bank, state.projection)
    bias = None
    if head == "lda":
        weights, bias = lda.solve_lda(gram, targets, counts, chosen)
        held_out = lda.held_out_scores(bank_h, bank_labels, gram, targets, counts, chosen)
    else:
        weights = solve_ridge(gram, targets, chosen)
        held_out = ridge_held_out_scores(bank_h, one_hot(bank_labels, classes), gram, targets, chosen)
    temperature = fit_temperature(held_out, bank_labels, TEMPERATURES) if len(bank_labels) else 1.0
    knots, coefficients = score_map.fit(held_out / temperature, bank_labels)
    out = RidgeState(state.projection, gram, targets, counts, bank, bank_labels)
    record = {("shrinkage" if head == "lda" else "ridge"): chosen, "temperature": temperature,
              "held_back": int(held.sum()), "calibrated_on": int(len(bank_labels)), "score_map": int(len(knots)),
              score_map.KNOTS_KEY: knots, score_map.COEFFICIENTS_KEY: coefficients}
    if bias is not None:
        record["bias"] = (bias / temperature).float().contiguous()
    return out, (weights / temperature).T.float().contiguous(), record


def pack_gram(gram: torch.Tensor) -> torch.Tensor:
    """G's lower triangle, row by row [M (M + 1) / 2]: G is symmetric, so a step's file keeps half of it (16 MB of
    32 at M = 2000). The lower triangle is what the Cholesky factorisations read and what the sums add to, so
    growing a learner from it gives the same numbers to the bit as growing it from the whole of G."""
    import torch

    return gram[torch.ones_like(gram, dtype=torch.bool).tril()].contiguous()


def unpack_gram(stored: torch.Tensor, size: int) -> torch.Tensor:
    """G [M, M] from :func:`pack_gram`'s triangle (a learner saved before G was packed keeps the whole matrix)."""
    import torch

    if stored.dim() == 2:
        return stored
    lower = torch.zeros(size, size, dtype=stored.dtype)
    lower[torch.ones(size, size, dtype=torch.bool).tril()] = stored
    return lower + lower.tril(-1).T


def _fits(gram: torch.Tensor, size: int) -> bool:
    """A stored G of an M x M matrix: packed (:func:`pack_gram`) or whole."""
    return tuple(gram.shape) in ((size * (size + 1) // 2,), (size, size))


def _no_training(cfg: Config, epochs: int, num_old: int, num_total: int) -> int:
    """A later step trains nothing: one pass of features and one solve."""
    return 0


@register_method("ranpac", Config, "a ridge-regression head on randomly projected frozen features (no training, "
                 "no exemplars, exact over steps)", plan=_no_training, first_plan=adapt_epochs,
                 frozen_backbone=True, run_defaults=(("memory", 0),), streams=True, known_images=True,
                 title="RanPAC: a ridge head on random projections of a frozen backbone (McDonnell et al., NeurIPS 2023)")
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    phases = adapt(ctx, cfg)
    start = time.perf_counter()
    # exemplars, if any were asked for, are not seen twice; a learner without them takes every image of the step,
    # images of known classes too (`sb add-task` gives such images only to a learner that keeps no exemplars)
    new = ctx.data.labels >= (ctx.num_old if ctx.memory_budget > 0 else 0)
    features = (ctx.features[new.cpu()] if ctx.features is not None  # streamed (sbcli.data.stream)
                else ctx.engine.frozen_features(ctx.model, ctx.data.images[new])).cpu()
    labels = ctx.data.labels[new].cpu()
    state = (RidgeState.start(features.shape[1], cfg, ctx.seed) if ctx.num_old == 0
             else RidgeState.stored(ctx.extra, ctx.num_old))
    state, head, chosen = fit_step(state, features, labels, ctx.num_total, cfg.ridge, ctx.seed * 1000 + ctx.step,
                                   cfg.inference)
    extra = {**state.tensors(), HEAD_KEY: head}
    if "bias" in chosen:
        extra[lda.BIAS_KEY] = chosen.pop("bias")
    for key in (score_map.KNOTS_KEY, score_map.COEFFICIENTS_KEY):  # every step writes its map (the identity too)
        extra[key] = chosen.pop(key).contiguous()
    record = {**chosen, "images": int(new.sum()), "projection": cfg.projection,
              "ridge_seconds": round(time.perf_counter() - start, 3)}
    return TaskResult(phases=phases, record=record, extra_state=extra)
