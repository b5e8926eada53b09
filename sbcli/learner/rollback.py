"""`sb rollback`: make a kept step current again by moving the store's pointer, after reading it in full."""

from __future__ import annotations

from pathlib import Path

from sbcli.learner.state import Learner
from sbcli.learner.store.commit import commit_pointer
from sbcli.learner.store.layout import read_stored
from sbcli.learner.store.lock import writer_lock


def rollback(learner_dir: Path, step: int) -> dict:
    """Switch the learner at ``learner_dir`` to kept step ``step`` (:func:`sbcli.api.rollback`); what it was and is."""
    learner_dir = Path(learner_dir)
    with writer_lock(learner_dir, "rollback"):
        stored = read_stored(learner_dir)
        before = stored.current
        learner = Learner.load(learner_dir, "cpu", step, recover=False)  # checked before the switch (the lock recovered)
        if step != before:
            commit_pointer(learner_dir, stored, step)
    return {"learner": str(learner_dir), "step": step, "previous": before, "classes": learner.state.num_classes,
            "kept_steps": sorted(stored.kept)}  # a pointer switch keeps every step
