"""Every learner file is checked at load, before any work: one sentence for anything malformed.

A learner may come from anywhere (a pull, a copy, a crafted file), so nothing in it is trusted:
:mod:`~sbcli.learner.validate.learner_json` checks ``learner.json`` (and, by the same rules, the settings a
run is about to record), :mod:`~sbcli.learner.validate.tensors` the safetensors files and their
tensors, both with the value checks of :mod:`~sbcli.learner.validate.fields`. Each failure raises
:class:`~sbcli.errors.LearnerError` naming the file and what is wrong. The names below are the ones
the loader, the store and the runs import.
"""

from sbcli.learner.validate.fields import RESTORE
from sbcli.learner.validate.learner_json import MAX_WIDTH, check_format_version, check_settings, check_state_json, read_json
from sbcli.learner.validate.tensors import (
    check_memory_tensors,
    check_model_tensors,
    parse_safetensors,
    read_safetensors,
)

__all__ = ["MAX_WIDTH", "RESTORE", "check_format_version", "check_memory_tensors", "check_model_tensors", "check_settings",
           "check_state_json", "parse_safetensors", "read_json", "read_safetensors"]
