"""`sb forget`: a new step of a learner on disk without some of its classes.

Load, check, (pass the given images), take the classes out, measure, save: one step like any other, so
`sb rollback` undoes it, and the card, `sb evaluate`, the ONNX export and the served versions follow the
classes the learner now knows. Every refusal comes before any image is decoded, the learner unchanged.

A ridge or LDA head on a frozen backbone (``--method ranpac``), with the classes' training images
(``data``): its sums lose their terms and equal, to float64's rounding, those of a learner never taught
them (:mod:`sbcli.methods.ridge_forget`); without them, the classes leave the head alone and their images
stay in the sums. Class prototypes (``simplecil``) are rows of their class alone: taken out exactly. A
trained network loses its head rows, its rule's per-class state and its exemplars of them, but its
backbone keeps what it learned from them (:mod:`sbcli.methods.class_rows`); the output says so.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from sbcli.data.stream import FolderStream
from sbcli.engine import distributed
from sbcli.engine.hardware import resolve_device
from sbcli.engine.loop import Engine
from sbcli.errors import ConfigError, DataError
from sbcli.learner.records import StepRecord, TaskRecord, TestSampleSettings
from sbcli.learner.state import Learner
from sbcli.learner.store.lock import writer_lock
from sbcli.methods import METHODS, class_rows, ridge_forget
from sbcli.run import evalsets
from sbcli.run.add_task import stream_features
from sbcli.run.evaluation import evaluate_learner, feature_cache_for
from sbcli.run.sequence import check_keep, save_from_main
from sbcli.run.steps import StepSummary

FORGET_SOURCE = {"kind": "forget"}  # the data record of a step that took classes out: it brought no data


def forget(learner_dir: Path, classes: list[str], data: Path | None = None, *, device: str = "auto",
           keep: int | None = None) -> StepSummary:
    """Take ``classes`` out of the learner at ``learner_dir`` as a new step (:func:`sbcli.api.forget`)."""
    check_keep(keep)
    learner_dir = Path(learner_dir)
    main = distributed.is_main_process()
    with writer_lock(learner_dir, "forget", enabled=main):
        dev = resolve_device(device)
        learner = Learner.load(learner_dir, dev, recover=not main)  # the writer's lock recovered it
        state = learner.state
        gone = _check(learner, learner_dir, classes, data)
        ids = [state.class_names.index(c) for c in gone]
        kept = [i for i in range(state.num_classes) if i not in set(ids)]
        listed = None if data is None else _listed(data, gone, state.image_size)
        start = time.perf_counter()
        engine = Engine(state.train_config, dev, learner.norm, state.seed * 1000 + state.steps)
        features = labels = None
        if listed is not None:
            features, _ = stream_features(listed, engine, learner.model)
            names = list(listed.class_names)
            labels = torch.tensor([state.class_names.index(names[int(y)]) for y in listed.labels], dtype=torch.long)
        if state.method == "ranpac":
            chosen = ridge_forget.last_solve([h.record for h in state.history])
            left = ridge_forget.forget(learner.extra, state.num_classes, kept, chosen, state.method_config.inference,
                                       features, labels, state.class_names)
        else:  # rows of their classes: prototypes exactly; a trained network's head, its backbone unchanged
            left = ridge_forget.Forgotten(class_rows.keep_rows(learner.extra, state.num_classes, kept),
                                          {"exact": METHODS.get(state.method).frozen_backbone})
        learner.extra = left.extra
        learner.model.keep_classes(kept)
        learner.memory.keep_classes(kept, state.num_classes)
        if learner.test_sample is not None:
            learner.test_sample = learner.test_sample.kept(kept, state.num_classes)
            recorded = state.test_sample or TestSampleSettings()
            state.test_sample = TestSampleSettings.of(learner.test_sample, len(kept), recorded.cap,
                                                      recorded.declined_tasks)
        state.class_names = [state.class_names[i] for i in kept]
        state.class_task = [state.class_task[i] for i in kept]
        state.tasks.append(TaskRecord([], dict(FORGET_SOURCE)))
        test = evalsets.test_data(learner).test
        metrics = evaluate_learner(learner, engine, test, cache=feature_cache_for(state.method))
        seconds = time.perf_counter() - start
        state.history.append(StepRecord(state.steps + 1, state.num_classes, metrics, None, [], left.record,
                                        round(seconds, 2), dataclasses.asdict(state.train_config), forgotten=gone))
        save_from_main(learner, learner_dir, keep)
        return StepSummary(state.steps, state.num_classes, metrics, seconds, notes=_notes(left.report, state.method),
                           state=state)


def _check(learner: Learner, where: Path, classes: list[str], data: Path | None) -> list[str]:
    """The classes to take out, in the learner's order, once each.

    Raises:
        ConfigError: no class named, a class the learner does not know, every class, a task sequence `sb train`
            has not finished (its resume would go on from the wrong step), or a method whose classes cannot be
            taken out yet.
    """
    state = learner.state
    if not classes:
        raise ConfigError("Name at least one class to take out (`sb forget LEARNER CLASS...`).")
    unknown = [c for c in dict.fromkeys(classes) if c not in state.class_names]
    if unknown:
        raise ConfigError(f"The learner at {where} does not know {', '.join(repr(c) for c in unknown[:3])}; its "
                          f"classes are listed by `sb evaluate {where}`.")
    planned = len(state.plan.scenario.get("sizes", [])) if state.plan is not None else 0
    if state.steps < planned:  # `sb train --resume` goes on from the step count, in the plan's class order
        raise ConfigError(f"The learner at {where} has learned {state.steps} of the {planned} tasks `sb train` planned; "
                          f"finish them first (`sb train ... --out {where} --resume`), then take classes out.")
    gone = [c for c in state.class_names if c in set(classes)]
    if len(gone) == state.num_classes:
        raise ConfigError(f"That would take out every class of the learner at {where}; keep at least one, or start "
                          "again from its backbone.")
    if data is not None and state.method != "ranpac":
        raise ConfigError(f"--data takes classes out of a ridge or LDA head's sums (--method ranpac); the learner at "
                          f"{where} is --method {state.method}, whose classes leave without their images: drop --data.")
    if data is not None and not Path(data).expanduser().is_dir():
        raise DataError(f"--data {data} is not a directory; give the class-per-folder training images of the classes "
                        "to take out.")
    return gone


def _listed(data: Path, gone: list[str], image_size: int) -> FolderStream:
    """The images of ``data``, listed: one folder per class taken out, no other.

    Raises:
        DataError: a folder of another class, or a class taken out that has no folder.
    """
    listed = FolderStream.scan(Path(data).expanduser(), image_size)
    others = [c for c in listed.class_names if c not in gone]
    if others:
        raise DataError(f"--data {data} holds {', '.join(others[:3])}, which this command does not take out; give "
                        "the training images of the classes taken out alone.")
    missing = [c for c in gone if c not in listed.class_names]
    if missing:
        raise DataError(f"--data {data} has no folder of {', '.join(missing[:3])}; give the training images of every "
                        "class taken out, or leave --data out to take them out of the head alone.")
    return listed


def _notes(record: ridge_forget.ForgetRecord, method: str) -> list[str]:
    """What the user should know about how the classes went."""
    if method == "simplecil":
        return ["A class prototype is the mean of its own class's features: the prototypes left are those of a "
                "learner never taught the classes taken out (its softmax scale stays the one fitted with them)."]
    if method != "ranpac":
        return ["Their head rows, their exemplars and the rule's state of them are gone, but the network's backbone "
                "keeps what it learned from them (and the other classes' rows were trained beside them): only "
                "training again without them would take that out."]
    if record.exact:
        return [f"Their {record.images or 0:,} training images were taken out of the head's sums: the learner "
                "is, to float64's rounding, one never taught those classes."]
    return ["Without --data the classes left the head alone: their images stay in the head's sums, where they still "
            "shape the other classes' head; give their training images with --data to take them out exactly."]
