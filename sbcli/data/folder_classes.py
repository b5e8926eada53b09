"""The classes of a class-per-folder tree from its folder names alone, before any image is decoded.

They let a command refuse, before any work, data that cannot make a sensible task: a test folder
whose classes are not the training folder's, new classes the learner already knows, or a sequence
of a single class.
"""

from __future__ import annotations

from pathlib import Path

from sbcli.errors import ConfigError, DataError

SHOWN = 4  # class names listed in a message


def class_names(root: Path) -> list[str]:
    """The sorted names of ``root``'s class folders (hidden ones ignored), as the folder loader reads them."""
    return sorted(p.name for p in Path(root).expanduser().iterdir() if p.is_dir() and not p.name.startswith("."))


def _some(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def check_same_classes(train: Path, test: Path) -> None:
    """Refuse a test folder whose class folders are not the training folder's."""
    train_names, test_names = class_names(train), class_names(test)
    if train_names == test_names:
        return
    missing = [n for n in train_names if n not in test_names]
    extra = [n for n in test_names if n not in train_names]
    parts = ([f"it lacks {_some(missing)}"] if missing else []) + ([f"it has {_some(extra)}, which {train} has not"] if extra else [])
    raise DataError(f"The test folder {test} does not hold the classes of {train} ({'; '.join(parts)}); "
                    "give a --test folder with the same class folders.")


def check_new_classes(train: Path, test: Path | None, known: list[str], known_refusal: str | None = "") -> None:
    """Refuse class folders (``sb add-task``) whose test folder holds other classes, or that name a class
    already learned where the learner cannot take more images of it.

    ``known_refusal``: None where the learner takes images of known classes (then the folder must still hold
    at least one new class); otherwise why it cannot, a clause ending the sentence ("" for no reason given).
    ``train`` that is not a directory is left to the loader, which names what it is.
    """
    if not Path(train).expanduser().is_dir():
        return
    if test is not None:
        check_same_classes(train, test)
    names = class_names(train)
    clash = sorted(set(names) & set(known))
    if clash and known_refusal is not None:
        why = f" ({known_refusal})" if known_refusal else ""
        raise DataError(f"The learner already knows {_some(clash)}{why}; rename those class folders or drop them.")


def check_first_task(sizes: list[int]) -> None:
    """Refuse a sequence that is one task of a single class: nothing to tell apart, so nothing is learned
    (the loss is 0 from the first batch). A single-class first task followed by others still grows a classifier."""
    if len(sizes) == 1 and sizes[0] < 2:
        raise ConfigError("The learner would learn a single class; a classifier needs at least two to tell apart: "
                          "add a class folder (or learn this class later with `sb add-task`).")
