"""``lda``: a shared-covariance linear discriminant head from the ridge head's running sums (``--method ranpac
--inference lda``), as in RanDumb, KLDA and FeCAM-style heads.

From the sums every ``ranpac`` step keeps (``G = H^T H``, ``Q = H^T Y``) and the class counts ``n``:

    mu_c = Q[:, c] / n_c                         class means
    S = (G - Q diag(1/n) Q^T) / (N - C)          the pooled within-class covariance (N images, C classes)
    S_a = (1 - a) S + a (tr S / M) I             shrunk towards a multiple of I (``a`` chosen on held-back images)
    w_c = S_a^-1 mu_c,  b_c = -mu_c^T S_a^-1 mu_c / 2

and an image scores ``h w_c + b_c`` for every class (equal priors: a class learned in a small step is not
penalised for it). Like the ridge head it is the same after T steps as one fit on every image, costs no pass
over the images and no new state beyond the counts, and exports as one linear layer (with a bias) after the
projection. The head is kept in ``ranpac.head`` [C, M] and ``ranpac.bias`` [C] (float32, the temperature
folded in).
"""

from __future__ import annotations

from typing import Any

from sbcli.methods.rules.ridge import HEAD_KEY, PROJECTION_KEY
from sbcli.methods.rules.rule import InferenceRule, register_rule

BIAS_KEY = "ranpac.bias"  # [C]: the discriminant's constant term (sbcli.methods.ranpac)
SHRINKAGES = (1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.3, 0.6, 0.9)  # a: from the sample covariance to a multiple of I


def covariance(gram: Any, targets: Any, counts: Any) -> tuple[Any, Any]:
    """(class means [C, M], pooled within-class covariance [M, M]) in float64 from G, Q and the counts."""
    means = (targets / counts[None, :]).T
    within = gram - (targets / counts[None, :]) @ targets.T
    return means, within / max(float(counts.sum()) - len(counts), 1.0)


def factor(cov: Any, shrinkage: float) -> Any:
    """The Cholesky factor of the shrunk covariance ``(1 - a) S + a (tr S / M) I``.

    Raises:
        ValueError: it is not positive definite (a shrinkage too small for these features).
    """
    import torch

    size = cov.shape[0]
    target = max(float(torch.trace(cov)) / size, 1e-12)
    shrunk = (1 - shrinkage) * cov + shrinkage * target * torch.eye(size, dtype=cov.dtype)
    chol, info = torch.linalg.cholesky_ex(shrunk)
    if int(info) != 0:
        raise ValueError(f"the shrunk covariance is not positive definite at {shrinkage:g}")
    return chol


def discriminant(means: Any, chol: Any) -> tuple[Any, Any]:
    """(W [M, C], b [C]) of the discriminant with class means ``means`` and the covariance factored as ``chol``."""
    import torch

    weights = torch.cholesky_solve(means.T.contiguous(), chol)
    return weights, -0.5 * (means * weights.T).sum(1)


def solve_lda(gram: Any, targets: Any, counts: Any, shrinkage: float) -> tuple[Any, Any]:
    """(W [M, C], b [C]) from the running sums and counts at ``shrinkage`` (:func:`discriminant`)."""
    means, cov = covariance(gram, targets, counts)
    return discriminant(means, factor(cov, shrinkage))


def held_out_scores(h: Any, labels: Any, gram: Any, targets: Any, counts: Any, shrinkage: float) -> Any:
    """Scores [K, C] of ``h`` (images counted in the sums, labels ``labels``) as if each had been left out of its
    own class's mean (the covariance, a sum over every image, is left as it is): an image meets its own class
    as an image the head never saw would. Rows of a class of one image keep their scores."""
    import torch

    means, cov = covariance(gram, targets, counts)
    chol = factor(cov, shrinkage)
    weights, bias = discriminant(means, chol)
    scores = h @ weights + bias
    n = counts[labels]
    keep = n > 1
    left = (means[labels] * n[:, None] - h) / torch.clamp(n - 1, min=1)[:, None]  # the mean without the image
    solved = torch.cholesky_solve(left.T.contiguous(), chol).T
    own = (h * solved).sum(1) - 0.5 * (left * solved).sum(1)
    rows = torch.arange(len(labels))
    scores[rows[keep], labels[keep]] = own[keep]
    return scores


def scoring(model: Any, extra: dict) -> Any:
    from sbcli.methods.rules.scoring_modules import ridge_module

    return ridge_module(model, extra, HEAD_KEY, PROJECTION_KEY, BIAS_KEY)


RULE = register_rule(InferenceRule(
    "lda", "a shared-covariance discriminant head",
    "a shared-covariance linear discriminant (LDA) head on randomly projected features, from the ridge head's "
    "running sums (a projection, a ReLU and one linear layer with a bias in the exported graph)",
    balance_refusal=("--balance-epochs does not go with --method ranpac (its backbone stays frozen and its head "
                     "is already the joint solution over every image seen); drop --balance-epochs."),
    scoring=scoring))
