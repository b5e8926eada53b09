"""The route a learner takes through sbcli's modules on one command, as ``sys.setprofile`` sees it.

Which frames count: a call into a function of an ``sbcli`` module that is handed the learner, i.e. one of
its arguments is the learner's folder as the command line was given it (a ``Path`` equal to it), a
:class:`~sbcli.learner.state.Learner` or its :class:`~sbcli.learner.state.LearnerState`. Frames of other
functions (the engine's batches, the data readers, torch) do not count and do not break the chain: the
learner's route is the stack of counted frames alone. A property of an object (``learner.memory``,
``state.num_classes``) is a read of that object's attribute, not a step of the route, and does not count.
The route ends when the store's commit
(:func:`sbcli.learner.store.commit.commit_step`) is entered.

What is counted: a *return into a module already left*, each time a counted frame returns and the counted
frame below it is in another module (control going back to a module the route had left). A route that
goes down through the layers and back once, module by module, has one such return per module boundary
crossed; every extra one is a back and forth (a module calling out to another and being called back into).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

COMMIT = ("sbcli.learner.store.commit", "commit_step")


@dataclass
class Route:
    """What one traced command did with the learner."""

    learner: Path
    entered: list[str] = field(default_factory=list)  # modules in the order the route first entered them
    back: Counter = field(default_factory=Counter)  # (from module, into module) -> returns into a module already left
    committed: bool = False
    _stack: list[tuple[int, str]] = field(default_factory=list)  # the counted frames (id, module), innermost last

    @property
    def returns(self) -> int:
        return sum(self.back.values())

    def _holds_learner(self, frame: FrameType) -> bool:
        from sbcli.learner.state import Learner, LearnerState

        code = frame.f_code
        owner = frame.f_locals.get("self")
        if isinstance(getattr(type(owner), code.co_name, None), property):
            return False  # a read of an attribute the learner computes, not a step of its route
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        for name in names:
            value = frame.f_locals.get(name)
            if isinstance(value, (Learner, LearnerState)) or (isinstance(value, Path) and value == self.learner):
                return True
        return False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.committed or event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("sbcli."):
            return
        if event == "call":
            if (module, frame.f_code.co_name) == COMMIT:
                self.committed = True
                return
            if self._holds_learner(frame):
                self._stack.append((id(frame), module))
                if module not in self.entered:
                    self.entered.append(module)
        elif self._stack and self._stack[-1][0] == id(frame):
            _, left = self._stack.pop()
            if self._stack and self._stack[-1][1] != left:
                self.back[(left, self._stack[-1][1])] += 1


def trace(learner: Path, run: Any) -> Route:
    """Run ``run()`` under the route tracer for ``learner``'s folder."""
    route = Route(Path(learner))
    sys.setprofile(route)
    try:
        run()
    finally:
        sys.setprofile(None)
    return route
