"""The typed learner state: one to_json/from_json pair, older learners filled in, nothing else changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sbcli.engine.loop import TrainConfig
from sbcli.errors import LearnerError
from sbcli.learner.state import LearnerState, read_state
from sbcli.methods.split_bridge import Config as SbConfig

ZOO_V1 = Path(__file__).resolve().parents[1] / "zoo" / "learners" / "demo-sb-tiny"


def test_a_format_1_learner_reads_as_typed_configs_with_the_settings_it_lacks_at_the_engines_old_values():
    stored = json.loads((ZOO_V1 / "learner.json").read_text(encoding="utf-8"))
    state = read_state(ZOO_V1)
    assert isinstance(state.train_config, TrainConfig) and isinstance(state.method_config, SbConfig)
    for key, value in stored["train_config"].items():  # every recorded setting as recorded
        assert getattr(state.train_config, key) == (tuple(value) if isinstance(value, list) else value), key
    assert "balance_epochs" not in stored["train_config"] and "warmup_epochs" not in stored["train_config"]
    train = state.train_config  # what the engine did before these settings existed
    assert (train.balance_epochs, train.warmup_epochs, train.val_fraction, train.incremental_lr) == (0, 0.0, 0.0, None)
    assert (train.nesterov, train.drop_last, train.zero_init_residual) == (True, True, False)
    assert state.method_config == SbConfig(**stored["method_config"])


def test_to_json_and_from_json_round_trip_and_write_what_learner_json_held():
    stored = json.loads((ZOO_V1 / "learner.json").read_text(encoding="utf-8"))
    state = read_state(ZOO_V1)
    data = json.loads(json.dumps(state.to_json()))
    assert LearnerState.from_json(data) == state
    assert data["method_config"] == stored["method_config"]
    assert {k: data["train_config"][k] for k in stored["train_config"]} == stored["train_config"]
    untouched = set(stored) - {"train_config", "files", "kept_steps", "keep"}
    assert {k: data[k] for k in untouched if k in data} == {k: stored[k] for k in untouched if k in data}


def test_a_state_with_a_field_no_version_wrote_is_refused_as_damaged(tmp_path):
    stored = json.loads((ZOO_V1 / "learner.json").read_text(encoding="utf-8"))
    with pytest.raises(TypeError):
        LearnerState.from_json({**stored, "train_config": {**stored["train_config"], "epochs_typo": 3}})
    broken = tmp_path / "broken"
    shutil.copytree(ZOO_V1, broken)
    (broken / "learner.json").write_text(json.dumps({**stored, "train_config": {"epochs_typo": 3}}))
    with pytest.raises(LearnerError):
        read_state(broken)
