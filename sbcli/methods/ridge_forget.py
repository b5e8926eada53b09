"""Classes taken out of a ridge (or LDA) head on a frozen backbone (:mod:`sbcli.methods.ranpac`).

G, Q and the counts are sums over images, so a class is taken out exactly by subtracting its images'
terms: ``G - H_f^T H_f``, and Q's and the counts' entries of the class dropped (Q's other columns never
held its images). With its training images given, what is left is, to float64's rounding, the sums
of a learner never taught the class, and the head is solved again from them. Without them, the
class leaves the head alone: its images stay in G, where they still shape the other classes' head.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sbcli.errors import DataError
from sbcli.methods import ranpac
from sbcli.methods.rules import lda, score_map
from sbcli.methods.rules.ridge import HEAD_KEY

if TYPE_CHECKING:
    import torch

SUM_TOLERANCE = 1e-4  # relative: the given images' projected features against Q's column of their class


@dataclasses.dataclass(frozen=True)
class ForgetRecord:
    """What a step that took classes out records of how they went, typed: ``exact`` when their training images
    left the head's sums (or a frozen backbone's prototypes went with them), and how many ``images`` that was."""

    exact: bool = False
    images: int | None = None

    @classmethod
    def from_json(cls, record: dict) -> ForgetRecord:
        return cls(bool(record.get("exact")), record.get("images"))


@dataclasses.dataclass(frozen=True)
class Forgotten:
    """What a forget leaves of a ridge learner: its method tensors and what its step records."""

    extra: dict[str, torch.Tensor]
    record: dict

    @property
    def report(self) -> ForgetRecord:
        """``record`` typed."""
        return ForgetRecord.from_json(self.record)


def last_solve(records: list[dict]) -> dict:
    """The record of the last step that solved the head (its ``ridge`` or ``shrinkage`` and ``temperature``), from a
    learner's records in step order; ``{}`` when none did."""
    return next((r for r in reversed(records) if "temperature" in r), {})


def check_images(state: ranpac.RidgeState, features: torch.Tensor, labels: torch.Tensor, gone: list[int],
                 names: list[str]) -> None:
    """Refuse images that are not the ones the learner holds of the classes ``gone``: each class's count must
    be its count in the sums, and the sum of its projected features its column of Q.

    Raises:
        DataError: one sentence naming the first class that does not match.
    """
    import torch

    for c in gone:
        mine = labels == c
        held = None if state.counts is None else int(state.counts[c])
        if held is not None and int(mine.sum()) != held:
            raise DataError(f"The learner learned {names[c]} from {held} images but --data holds {int(mine.sum())}; "
                            "give exactly the training images it was taught, or leave --data out to take the class "
                            "out of the head alone.")
        total = ranpac.project(features[mine], state.projection).sum(0)
        column = state.targets[:, c]
        if float(torch.linalg.vector_norm(total - column)) > SUM_TOLERANCE * (float(torch.linalg.vector_norm(column)) + 1):
            raise DataError(f"The images of {names[c]} in --data are not the ones the learner was taught (their "
                            "features do not add up to its sums); give exactly those training images, or leave "
                            "--data out to take the class out of the head alone.")


def forget(extra: dict[str, torch.Tensor], num_classes: int, keep: list[int], chosen: dict, inference: str,
           features: torch.Tensor | None = None, labels: torch.Tensor | None = None,
           names: list[str] | None = None) -> Forgotten:
    """The method tensors without the classes not in ``keep`` (old class ids, in their order).

    ``chosen``: the last step's record (its ``ridge`` or ``shrinkage`` and ``temperature``). With
    ``features``/``labels`` (every training image of the classes taken out, old ids), the sums lose their
    terms and the head is solved again at the same strength, its temperature fitted again on the
    calibration bank; without them only the head's rows, Q's columns and the counts go.

    Raises:
        DataError: the images are not those the learner was taught (:func:`check_images`).
    """
    import torch

    state = ranpac.RidgeState.stored(extra, num_classes)
    gone = [c for c in range(num_classes) if c not in set(keep)]
    index = torch.tensor(keep, dtype=torch.long)
    exact = features is not None and labels is not None
    gram = state.gram
    if exact:
        check_images(state, features, labels, gone, names or [str(c) for c in range(num_classes)])
        gram = state.gram.clone()
        for start in range(0, len(features), ranpac.ROWS):  # G - H^T H, as accumulate adds it
            h = ranpac.project(features[start:start + ranpac.ROWS], state.projection)
            hh = h.T @ h
            gram -= hh.tril() + hh.tril(-1).T
    relabel = torch.full((num_classes,), -1, dtype=torch.long)
    relabel[index] = torch.arange(len(keep))
    bank, bank_labels = state.bank, state.bank_labels
    if bank is not None and bank_labels is not None:
        rows = relabel[bank_labels] >= 0
        bank, bank_labels = bank[rows], relabel[bank_labels[rows]]
    counts = None if state.counts is None else state.counts[index]
    left = ranpac.RidgeState(state.projection, gram, state.targets[:, index].contiguous(), counts, bank, bank_labels)
    out = {k: v for k, v in extra.items() if k not in (HEAD_KEY, lda.BIAS_KEY)}
    out.update(left.tensors())
    record: dict = {"exact": exact}
    if not exact:  # the other classes' head is the one they had: G, and so their columns of W, unchanged
        out[HEAD_KEY] = extra[HEAD_KEY][index].contiguous()
        if lda.BIAS_KEY in extra:
            out[lda.BIAS_KEY] = extra[lda.BIAS_KEY][index].contiguous()
        return Forgotten(out, record)
    head, bias, temperature, (knots, coefficients) = _solve(left, inference, chosen, len(keep))
    out[HEAD_KEY] = head
    if score_map.KNOTS_KEY in extra:  # a learner that maps its scores: the map fitted again with the temperature
        out[score_map.KNOTS_KEY], out[score_map.COEFFICIENTS_KEY] = knots, coefficients
    if bias is not None:
        out[lda.BIAS_KEY] = bias
    record.update({("shrinkage" if inference == "lda" else "ridge"): _strength(chosen, inference),
                   "temperature": temperature, "images": int(len(features)),
                   "calibrated_on": 0 if bank_labels is None else int(len(bank_labels))})
    return Forgotten(out, record)


def _strength(chosen: dict, inference: str) -> float:
    key, fallback = ("shrinkage", lda.SHRINKAGES[-1]) if inference == "lda" else ("ridge", 1.0)
    value = chosen.get(key)
    return float(value) if isinstance(value, (int, float)) else fallback


def _solve(state: ranpac.RidgeState, inference: str, chosen: dict,
           classes: int) -> tuple[torch.Tensor, torch.Tensor | None, float, tuple[torch.Tensor, torch.Tensor]]:
    """The head [C, M] (temperature folded in), the LDA's bias, the temperature and the map of the tempered scores
    (:mod:`sbcli.methods.rules.score_map`), from the sums as they are."""
    strength = _strength(chosen, inference)
    bank_h = None if state.bank is None else ranpac.project(state.bank, state.projection)
    bias = None
    if inference == "lda":
        weights, bias = lda.solve_lda(state.gram, state.targets, state.counts, strength)
        held_out = (None if bank_h is None else
                    lda.held_out_scores(bank_h, state.bank_labels, state.gram, state.targets, state.counts, strength))
    else:
        weights = ranpac.solve_ridge(state.gram, state.targets, strength)
        held_out = (None if bank_h is None else ranpac.ridge_held_out_scores(
            bank_h, ranpac.one_hot(state.bank_labels, classes), state.gram, state.targets, strength))
    temperature = (ranpac.fit_temperature(held_out, state.bank_labels, ranpac.TEMPERATURES)
                   if held_out is not None and len(state.bank_labels) else 1.0)
    head = (weights / temperature).T.float().contiguous()
    mapped = score_map.identity() if held_out is None else score_map.fit(held_out / temperature, state.bank_labels)
    return head, None if bias is None else (bias / temperature).float().contiguous(), temperature, mapped
