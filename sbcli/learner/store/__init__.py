"""How a learner sits on disk: the layout, the one atomic commit point, the writer lock.

- :mod:`sbcli.learner.store.layout`: file names, ``learner.json``'s storage keys, reading what is committed
  (confined to the learner's directory, every named file checked against its recorded hash).
- :mod:`sbcli.learner.store.objects`: large tensors as content-addressed blocks (``objects/<sha256>``), stored once.
- :mod:`sbcli.learner.store.commit`: writing a step and switching ``learner.json`` to it (fsync, one rename).
- :mod:`sbcli.learner.store.lock`: one writer per learner (``filelock``), refused at once naming the holder.
- :mod:`sbcli.learner.store.outputs`: outputs never clobber inputs (``-o``/``--out`` checks).
- :mod:`sbcli.learner.store.legacy`: learners left behind by the save of sbcli 0.1 (``.L.old-*``/``.L.tmp-*``).

See docs/learner-format.md for the user-facing description.
"""
