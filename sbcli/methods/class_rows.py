"""Classes taken out of a learner whose classes are rows: class prototypes (``--method simplecil``) and the
head and rule state of a trained network (``sb``, ``std``, ``dd``, ``finetune``, ``joint``).

SimpleCIL's prototype of a class is the mean of that class's features alone, so the rows left are, to the
bit, those of a learner never taught the classes taken out; its softmax scale stays the one fitted with
them. A trained network's head rows, BiC's per-class correction and iCaRL's class means go, but its
backbone (and the other classes' rows, trained beside them) keeps what it learned from the classes: only
retraining without them would take that out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sbcli.methods.rules.bic import SCALE_KEY as BIC_SCALE
from sbcli.methods.rules.bic import SHIFT_KEY as BIC_SHIFT
from sbcli.methods.rules.nme import MEANS_KEY
from sbcli.methods.rules.prototype import PROTOTYPES_KEY

if TYPE_CHECKING:
    import torch

PER_CLASS = (BIC_SCALE, BIC_SHIFT, MEANS_KEY, PROTOTYPES_KEY, "simplecil.counts")  # [C, ...]: a row a class
BANKS = (("simplecil.bank", "simplecil.bank_terms", "simplecil.bank_labels"),)  # rows labelled by class


def keep_rows(extra: dict[str, torch.Tensor], num_classes: int, keep: list[int]) -> dict[str, torch.Tensor]:
    """The method tensors of the classes ``keep`` alone (old ids, in their new order); other tensors as they were.

    A per-class tensor (:data:`PER_CLASS`) keeps its rows of ``keep``; a bank (:data:`BANKS`) keeps the rows
    labelled with one of them, relabelled by their place in ``keep``.
    """
    import torch

    index = torch.tensor(keep, dtype=torch.long)
    relabel = torch.full((num_classes,), -1, dtype=torch.long)
    relabel[index] = torch.arange(len(keep))
    out = {k: (v[index].contiguous() if k in PER_CLASS and v.dim() and v.shape[0] == num_classes else v)
           for k, v in extra.items()}
    for *rows, labels in BANKS:
        if labels in extra:
            kept = relabel[extra[labels].long()] >= 0
            out[labels] = relabel[extra[labels].long()[kept]].to(extra[labels].dtype).contiguous()
            out.update({k: extra[k][kept].contiguous() for k in rows if k in extra})
    return out
