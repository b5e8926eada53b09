"""A strictly increasing map of a closed-form head's scores: probabilities that hold at any length of a sequence.

One temperature fitted on the calibration bank (every class seen, each image scored as if left out of the fit)
sets how sharp the softmax is, not its shape. On ten tasks the ridge head stayed over-confident where its top
score is high and under-confident where it is low: 6.1 % expected calibration error at the tenth step of
Tiny-ImageNet-100 on EfficientNet-Lite0, 6.0 % on the self-trained backbone of docs/lab/benchmarks.md, where
even the one temperature best for the test images themselves left 6.1 and 6.0 %.

So, after the temperature, every class's score ``s`` goes through one piecewise-linear map

    f(s) = c_0 s + sum_i c_i relu(s - k_i),

its knots ``k_i`` at quantiles of the bank's scores and its segment slopes ``c_0, c_0 + c_1, ...`` positive
and bounded (each ``exp(2 tanh(b))`` of a free parameter ``b``), fitted by the lowest negative log-likelihood of softmax(f(s)) on the
bank's left-out scores (L-BFGS). ``f`` is increasing, so every image keeps its order of classes: predictions,
and every accuracy, are the head's own. In the exported graph it is a Mul, a Sub, a Relu and a MatMul.

With few images in the bank the map over-fits it (on five to fifteen classes of 20 images it raised the error
the temperature left), so below :data:`MIN_BANK` images it is the identity: the temperature alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only inside the functions: the method and rule modules that name these keys stay light
    import torch

KNOTS_KEY, COEFFICIENTS_KEY = "ranpac.score_knots", "ranpac.score_coefficients"  # [K] and [K + 1], float32
KNOTS = 6  # knots of the map, at evenly spaced quantiles of the bank's scores between QUANTILES
QUANTILES = (0.05, 0.995)
MIN_BANK = 400  # bank images below which the map is the identity (20 images a class of 20 classes)
MAX_SCORES = 200_000  # bank scores the knots are placed from (a seeded draw beyond)
ITERATIONS = 200
MAX_LOG_SLOPE = 2.0  # a segment's slope stays within e^-2 .. e^2: unbounded, the slope below the lowest knot ran to
# 1e8 (pushing far-off classes to minus infinity), and float32 lost the increase in the difference of two such slopes


def identity() -> tuple[torch.Tensor, torch.Tensor]:
    """The map that leaves every score as it is: no knot, slope 1."""
    import torch

    return torch.zeros(0), torch.ones(1)


def _hinges(scores: torch.Tensor, knots: torch.Tensor) -> torch.Tensor:
    """[..., K + 1]: each score, then its excess over every knot."""
    import torch

    return torch.cat([scores[..., None], torch.relu(scores[..., None] - knots)], dim=-1)


def apply_map(scores: torch.Tensor, knots: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """``f(scores)``, elementwise (any shape), in the scores' dtype."""
    if knots.numel() == 0:
        return scores * coefficients[0].to(scores.dtype)
    return _hinges(scores, knots.to(scores.dtype)) @ coefficients.to(scores.dtype)


def fit(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knots [K] and coefficients [K + 1] (float32) of the map with the lowest negative log-likelihood of
    ``softmax(f(scores))`` on ``labels``; the identity for a bank under :data:`MIN_BANK` images, or where the fit
    does not end finite and below the identity's likelihood."""
    import torch

    if len(labels) < MIN_BANK:
        return identity()
    s = scores.detach().double()
    flat = s.flatten()
    if flat.numel() > MAX_SCORES:
        flat = flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(0))[:MAX_SCORES]]
    knots = torch.quantile(flat, torch.linspace(*QUANTILES, KNOTS, dtype=torch.float64))
    hinges = _hinges(s, knots)
    log_slopes = torch.zeros(KNOTS + 1, dtype=torch.float64, requires_grad=True)

    def coefficients() -> torch.Tensor:
        slopes = torch.exp(MAX_LOG_SLOPE * torch.tanh(log_slopes))  # each within e^-2 .. e^2 of the tempered scale
        return torch.cat([slopes[:1], slopes[1:] - slopes[:-1]])

    def nll(c: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(hinges @ c, labels.long())

    optimizer = torch.optim.LBFGS([log_slopes], lr=1, max_iter=ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nll(coefficients())
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    with torch.no_grad():
        fitted = coefficients()
        plain = torch.nn.functional.cross_entropy(s, labels.long())
        if not bool(torch.isfinite(fitted).all()) or not float(nll(fitted)) < float(plain):
            return identity()
    return knots.float(), fitted.float()
