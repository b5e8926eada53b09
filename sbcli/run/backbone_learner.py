"""A learner with no classes yet: a pretrained backbone, a method and its settings, waiting for its first task.

``sb pull`` of a backbone entry of the zoo makes one (:func:`pull_backbone`); ``sb add-task`` then learns its
first classes as it learns any later ones, so a user's own classes start from one command, on any machine:

    sb pull resnet50-in1k-ridge -o my-classifier
    sb add-task my-classifier photos/train --test photos/test

It is the learner ``sb train`` would begin with the same settings, saved before its first step: step 0
(``sb rollback LEARNER 0`` goes back to it). Its network is the backbone under a head of no rows; its
normalisation and resolution are the weights' own (timm's configuration, ImageNet's statistics, or an sbcli
learner's). Without pretrained weights there is nothing to begin from (no images to take statistics
from, no features worth keeping), so it is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sbcli.atomic import staging
from sbcli.config.options import RunOptions, own_data_options
from sbcli.errors import ConfigError
from sbcli.hub.client import HubConfig
from sbcli.hub.pretrained import PretrainedWeights
from sbcli.hub.pull import PullReport, contents, move_into_place
from sbcli.hub.weight_packages import check_input_size
from sbcli.hub.zoo import BACKBONE_FILE, ZooEntry, ZooIndex
from sbcli.learner import preflight
from sbcli.learner.records import PretrainedRecord
from sbcli.learner.state import Learner
from sbcli.learner.store.lock import writer_lock
from sbcli.learner.store.outputs import check_output_dir
from sbcli.nets.timm_backbone import timm_input
from sbcli.run.sequence import check_out, check_run, load_weights, new_learner, new_state, normalization


def start_learner(run: RunOptions, out: Path, *, image_size: int | None = None,
                  weights: PretrainedWeights | None = None) -> Learner:
    """Save at ``out`` a learner with no classes: the pretrained backbone ``run`` names, its method and settings.

    ``image_size``: the side its images are resized to (default: the resolution the weights were trained at).
    ``weights``: those weights, already loaded and checked (default: loaded here, as `sb train` loads them).

    Raises:
        ConfigError: no pretrained weights, no known resolution, or a setting a run refuses.
        ExportError: the Hub cannot give the weights (unknown repository or revision, offline and not cached).
        LearnerError: ``out`` is not an empty or new directory.
    """
    out = Path(out)
    device = check_run(run)
    check_out(out, resume=False)
    preflight.check_writable(out)
    with writer_lock(out, "start", create=True):
        weights = weights or load_weights(run)
        if weights is None:
            raise ConfigError("A learner with no classes starts from pretrained weights; give --pretrained (a Hub "
                              "repository, a .safetensors file or an sbcli learner) or --arch timm/NAME.")
        timm_in = timm_input(run.arch)
        size = image_size or weights.info.input_size or (timm_in.image_size if timm_in else None)
        check_input_size(weights.info, size)
        if size is None:
            raise ConfigError(f"The resolution {run.arch}'s weights were trained at is not known; give --image-size.")
        norm = normalization(None, weights, timm_in)
        state = new_state(run, int(size), norm.to_json(), None, None)
        learner = new_learner(state, run, 0, weights, device)
        learner.save(out)
    return learner


def pull_backbone(entry: ZooEntry, index: ZooIndex, revision: str | None, target: Path, hub_cfg: HubConfig) -> PullReport:
    """``sb pull`` of a backbone entry: its pinned weights (the Hub, else the local cache), verified against the
    entry's SHA-256, made into a learner with no classes in a folder beside ``target``, then moved into place, so
    that a refused pull leaves nothing behind.

    Raises:
        ConfigError: another revision than the pinned one, or a file whose SHA-256 differs (nothing is installed).
        ExportError: the Hub cannot give the weights and the cache does not hold them.
        LearnerError: ``target`` exists and is not empty.
    """
    if entry.kind == "package":
        return _pull_package_backbone(entry, index, revision, target)
    if revision is not None and revision != entry.revision:
        raise ConfigError(f"Zoo entry {entry.name} is pinned to revision {entry.revision} of {entry.target}; drop "
                          f"'@{revision}', or start from that revision with `sb train FOLDER --pretrained "
                          f"{entry.target}@{revision}`.")
    check_output_dir(target, option="-o")  # before any download
    seq, run = own_data_options(str(index.recipe_path(entry)))
    run = dataclasses.replace(run, pretrained=f"{entry.target}@{entry.revision}",
                              pretrained_sha256=entry.files[BACKBONE_FILE])
    check_run(run)  # the recipe's settings, before any download
    weights = load_weights(run, hub_cfg)  # fetched and checked against the entry's SHA-256 before anything is written
    learner, notes = _install(entry, run, seq.image_size, weights, target)
    record = learner.state.provenance.backbone
    return PullReport(target, f"zoo entry {entry.name} ({entry.target}@{entry.revision})", entry.revision,
                      None if record is None else record.commit, [BACKBONE_FILE], [BACKBONE_FILE], weights.from_cache, notes, contents(learner))


def _pull_package_backbone(entry: ZooEntry, index: ZooIndex, revision: str | None, target: Path) -> PullReport:
    """``sb pull`` of a backbone entry whose weights come from an installed weight package: no network at all."""
    if revision is not None:
        raise ConfigError(f"Zoo entry {entry.name} comes from the installed weight package {entry.target}, which has no "
                          f"revisions; drop '@{revision}'.")
    check_output_dir(target, option="-o")
    seq, run = own_data_options(str(index.recipe_path(entry)))
    (file_name, digest), = entry.files.items()
    run = dataclasses.replace(run, pretrained=entry.target, pretrained_sha256=digest)
    check_run(run)
    weights = load_weights(run)  # checked against the entry's SHA-256 before the file is read
    learner, notes = _install(entry, run, seq.image_size, weights, target)
    record = learner.state.provenance.backbone or PretrainedRecord("package")
    return PullReport(target, f"zoo entry {entry.name} ({record.package} {record.version})", None,
                      None, [file_name], [file_name], False, notes, contents(learner))


def _install(entry: ZooEntry, run: RunOptions, image_size: int | None, weights: PretrainedWeights,
             target: Path) -> tuple[Learner, list[str]]:
    """The learner with no classes built in a staging folder beside ``target`` and moved into place in one
    rename (a SIGKILLed pull's folder is removed by the next pull beside it); the note that says what next."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with staging(target, "pull") as tmp:
        learner = start_learner(run, tmp, image_size=image_size, weights=weights)
        move_into_place(tmp, target)
    notes = [f"this learner has no classes yet: `sb add-task {target} FOLDER --test FOLDER` learns the first ones "
             f"({entry.method} + {entry.inference} on the frozen {entry.network} at {learner.state.image_size} px)"]
    return learner, notes
