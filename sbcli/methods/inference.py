"""Scores over every seen class for a learner's inference rule (:mod:`sbcli.methods.rules`).

Rules in the network's weights (``wa``, ``none``) score with the logits; a rule with a scoring
builder (``bic``, ``nme``, ``icarl``, ``prototype``, ``ridge``) scores with the module it builds from
the network and the learner's extra tensors (:mod:`sbcli.methods.rules.scoring_modules`); a rule with a refresh
rebuilds its state after every memory update (``icarl``'s class means).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sbcli.engine.loop import Engine
from sbcli.methods.rules import RULES
from sbcli.nets.resnet import IncrementalResNet


def scores(model: IncrementalResNet, extra: dict[str, torch.Tensor], inference: str, engine: Engine,
           images: torch.Tensor) -> torch.Tensor:
    """Scores [N, C_seen] of uint8 images under the named inference rule."""
    module = scoring_module(model, extra, inference)
    return engine.logits(module, images)


def scoring_module(model: IncrementalResNet, extra: dict[str, torch.Tensor], inference: str) -> nn.Module:
    """The rule's scores as one module of normalised images [B, 3, H, W] -> [B, C_seen].

    Rules in the weights (``none``, ``wa``) give the model itself. The module is in the model's
    train/eval mode.
    """
    builder = RULES.get(inference).scoring
    module = model if builder is None else builder(model, extra)
    return module.train(model.training)


def outside_network(inference: str) -> bool:
    """Whether the rule scores with more than the network's own logits (a scoring module of its own)."""
    return RULES.get(inference).scoring is not None


def refresh_state(cfg: Any, model: IncrementalResNet, images: torch.Tensor, labels: torch.Tensor,
                  features: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state of ``cfg.inference`` rebuilt from the exemplars ``images``/``labels`` after a memory update.

    ``cfg`` is the method's Config: a refresh may read its settings (iCaRL's ``nme_flips``). ``features``:
    the pooled features of images under ``model`` as it is now (``Engine.features``).

    Empty for rules whose state does not depend on the memory (all but ``icarl``).
    """
    refresh = RULES.get(cfg.inference).refresh
    return {} if refresh is None else refresh(model, images, labels, features, cfg)
