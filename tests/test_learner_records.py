"""The typed records of learner.json: a learner loaded and written again keeps its bytes, key order included."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
from pathlib import Path

import pytest
import torch

from sbcli import __version__, api
from sbcli.engine.loop import TrainConfig
from sbcli.learner.records import MemorySettings, Provenance, StepRecord, TaskRecord, TestSampleSettings
from sbcli.learner.state import LearnerState, read_state
from sbcli.learner.store.commit import state_bytes
from sbcli.methods.base import MethodConfig
from sbcli.metrics import StepMetrics

ZOO_V1 = Path(__file__).resolve().parents[1] / "zoo" / "learners" / "demo-sb-tiny"
STORAGE = ("files", "kept_steps", "keep", "hashes", "objects")


@pytest.fixture(scope="module")
def icarl_private(four_colors, tmp_path_factory) -> Path:
    """Two steps of STD + iCaRL (a network_metrics beside the metrics), test images kept out (declined tasks)."""
    run = api.RunOptions(method="std", method_options={"inference": "icarl"}, width=0.125,
                         train=TrainConfig(epochs=1, batch_size=16), memory=12, device="cpu")
    seq = api.SequenceOptions(source=str(four_colors["train"]), test=str(four_colors["test"]), image_size=16, tasks=2,
                              test_sample=False)
    out = tmp_path_factory.mktemp("records") / "icarl"
    api.train(seq, run, out)
    return out


def rewritten(data: dict) -> bytes:
    """``data`` (a learner.json or state.json object) through the typed state and back, as a save writes it."""
    state = LearnerState.from_json({k: v for k, v in data.items() if k not in STORAGE})
    return state_bytes({**state.to_json(), **{k: data[k] for k in STORAGE if k in data}})


@pytest.mark.parametrize("fixture", ["one_task_learner", "icarl_private"])
def test_a_saved_learner_is_written_back_byte_for_byte(fixture, request):
    learner = request.getfixturevalue(fixture)
    paths = [learner / "learner.json", *sorted(learner.glob("steps/*/state.json"))]
    assert len(paths) > 1
    for path in paths:
        raw = path.read_bytes()
        assert rewritten(json.loads(raw)) == raw, path


def test_the_records_hold_what_a_run_recorded(icarl_private):
    state = read_state(icarl_private)
    assert isinstance(state.method_config, MethodConfig) and state.method_config.inference == "icarl"
    first, second = state.history
    assert isinstance(second, StepRecord) and isinstance(second.metrics, StepMetrics)
    assert (first.step, first.num_classes, second.step, second.num_classes) == (1, 2, 2, 4)
    assert second.network_metrics is not None and second.metrics.counts is not None
    recorded = json.loads(json.dumps(dataclasses.asdict(state.train_config)))
    assert second.seconds is not None and second.train_config == recorded  # the settings step 2 ran with
    assert [t.classes for t in state.tasks] == [state.class_names[:2], state.class_names[2:]]
    assert isinstance(state.tasks[0], TaskRecord) and state.tasks[0].source["kind"] == "folder"
    assert state.memory == MemorySettings(12, "random", 0)
    assert state.test_sample == TestSampleSettings(100, [0, 0, 0, 0], [1, 2])
    assert state.provenance == Provenance("folder", __version__, torch.__version__, platform.python_version())


def test_a_format_1_learner_keeps_its_records_as_it_wrote_them():
    raw = json.loads((ZOO_V1 / "learner.json").read_text(encoding="utf-8"))
    data = LearnerState.from_json(raw).to_json()
    for key in ("history", "tasks", "memory", "provenance", "class_names", "plan"):
        assert json.dumps(data[key], indent=2) == json.dumps(raw[key], indent=2), key  # same keys, same order
    assert "test_sample" not in raw and data["test_sample"] == {}  # it carries none: written as today
    assert data["format_version"] == 1 and [k for k in data if k != "test_sample"] == list(raw)


def test_what_a_record_does_not_know_is_written_back_where_it_was():
    nan = float("nan")
    metrics = {"overall": 50.0, "per_task": [50.0], "old": nan, "new": 50.0, "intra_old": nan, "intra_new": 50.0}
    entry = {"step": 1, "num_classes": 2, "metrics": metrics, "network_metrics": {**metrics, "overall": 40.0},
             "phases": [{"name": "base", "epochs": 1}], "record": {"wa_factor": 0.9}, "seconds": 1.5,
             "train_config": {"epochs": 1}, "from_a_newer_sbcli": {"x": 1}}
    assert json.dumps(StepRecord.from_json(entry).to_json()) == json.dumps(entry)
    older = {k: entry[k] for k in ("step", "num_classes", "metrics", "phases", "record", "seconds")}  # format 1's keys
    assert json.dumps(StepRecord.from_json(older).to_json()) == json.dumps(older)
    provenance = {"dataset": "demo", "sbcli_version": "0.1.0", "torch_version": "2.4", "python": "3.11.7",
                  "pretrained": {"source": "random"}, "host": "lab-3"}
    assert list(Provenance.from_json(provenance).to_json().items()) == list(provenance.items())
    task = {"classes": ["a"], "source": {"kind": "demo"}, "note": "kept"}
    assert list(TaskRecord.from_json(task).to_json().items()) == list(task.items())
    assert TestSampleSettings.from_json({}) is None
    assert math.isnan(StepMetrics.from_json({"overall": 1.0, "per_task": [1.0]}).old)  # not measured


def test_a_step_without_what_its_record_needs_is_refused_as_damaged_before_any_record_is_built():
    from sbcli.errors import LearnerError
    from sbcli.learner import validate

    raw = json.loads((ZOO_V1 / "learner.json").read_text(encoding="utf-8"))
    for key, value in (("step", None), ("num_classes", "2"), ("network_metrics", {"overall": 1.0})):
        entry = {k: v for k, v in raw["history"][0].items() if k != key}
        if value is not None:
            entry[key] = value
        with pytest.raises(LearnerError, match=f"history\\[0\\].{key}"):
            validate.check_state_json({**raw, "history": [entry, *raw["history"][1:]]}, "learner.json")


def test_the_nested_records_read_typed_give_back_the_json_they_were_read_from():
    from sbcli.data.source_records import SourceRecord
    from sbcli.engine.loop import PhaseReport
    from sbcli.learner.records import PretrainedRecord, SequencePlan

    pretrained = [
        {"source": "hub", "repo": "timm/resnet18.a1_in1k", "revision": "main", "commit": "abc", "file": "model.safetensors",
         "sha256": "00" * 32, "arch": "resnet18-in", "input_size": 224},
        {"source": "learner", "name": "base", "sha256": "11" * 32, "arch": "resnet18", "width": 0.5, "classes": 10, "steps": 2},
        {"source": "package", "name": "lite0", "package": "some-weights", "version": "1.0", "file": "w.pth",
         "sha256": "22" * 32, "input_size": 224, "arch": "timm/efficientnet_lite0", "from_a_newer_sbcli": 1},
        {"source": "random"},
    ]
    for record in pretrained:
        assert json.dumps(PretrainedRecord.from_json(record).to_json()) == json.dumps(record)
    typed = PretrainedRecord.from_json(pretrained[1])
    assert (typed.origin, typed.width, typed.input_size) == ("base", 0.5, None)
    record = {"kind": "folder", "name": "train", "dataset": "photos", "image_size": 32,
              "train": {"classes": ["a", "b"], "counts": [3, 4], "sha256": "33" * 32}, "test": {"name": "val"}}
    spec = {"kind": "cifar100", "root": "/data/c100", "test": "/data/c100/test"}  # format 1: paths
    for source in (record, spec, {"kind": "demo"}):
        assert json.dumps(SourceRecord.from_json(source).to_json()) == json.dumps(source)
    assert SourceRecord.from_json(record).train_counts == [3, 4] and SourceRecord.from_json(record).legacy_path is None
    assert SourceRecord.from_json(spec).legacy_path == "/data/c100" and SourceRecord.from_json(spec).train_counts is None
    plan = {"source": spec, "scenario": {"order": [1, 0], "sizes": [1, 1]}, "note": "kept"}
    assert json.dumps(SequencePlan.from_json(plan).to_json()) == json.dumps(plan)
    phase = {"name": "C", "epochs": 2, "final_loss": 0.5, "seconds": 1.25, "images_per_s": 80.0, "precision": "bf16",
             "processes": 1, "selected_epoch": 2}
    assert json.dumps(PhaseReport.from_json(phase).to_json()) == json.dumps(phase)
    older = PhaseReport.from_json({"name": "base", "epochs": 1})  # format 1: what a phase did not record yet
    assert (older.precision, older.processes, older.seconds) == ("fp32", 1, 0.0)
    step = StepRecord.from_json({"step": 2, "num_classes": 4, "metrics": {"overall": 1.0, "per_task": [1.0, 1.0]},
                                 "phases": [phase, {"name": "A", "epochs": 3}]})
    assert [p.name for p in step.phase_reports] == ["C", "A"] and step.epochs_trained == 5


def test_split_and_bridge_records_read_typed():
    from sbcli.methods.split_bridge import SplitBridgeRecord

    after = {"overall": 30.0, "per_task": [20.0, 40.0]}
    record = {"partition": {"is_split": True}, "cross_norm_before_disconnect": 1.5, "after_B": after,
              "after_C": {**after, "overall": 35.0}, "wa_factor": 0.9}
    typed = SplitBridgeRecord.from_json(record)
    assert typed is not None and (typed.after_B.overall, typed.after_C.overall, typed.wa_factor) == (30.0, 35.0, 0.9)
    assert typed.before_balance is None and typed.partition == {"is_split": True}
    assert SplitBridgeRecord.from_json({"exact": True}) is None  # another method's record
