"""The model card (``README.md``) pushed with a learner: what it is, its classes, how it was
trained, how accurate each step was, how to continue it and how to serve its ONNX file.

Plain text built from ``learner.json``; no network and no Hub library needed, so the card can be
checked (and written next to a learner) offline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from sbcli import __version__
from sbcli.learner import LearnerState
from sbcli.metrics import history_summary

METHOD_NAMES = {
    "sb": "Split-and-Bridge (Kim & Choi, AAAI 2021)",
    "std": "STD: lambda * KD + (1 - lambda) * CE (the standard knowledge-distillation baseline)",
    "finetune": "fine-tuning on new data plus exemplars (the lower bound)",
}
INFERENCE_NAMES = {
    "wa": "weight aligning (folded into the head weights)",
    "none": "the plain head",
    "bic": "BiC bias correction (folded into the exported graph)",
    "nme": "nearest mean of exemplars (class means inside the exported graph)",
}


def _pct(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2f}"


def _yaml_front_matter(state: LearnerState) -> str:
    tags = ["continual-learning", "class-incremental-learning", "image-classification", "onnx", f"sbcli-{state.method}"]
    lines = ["---", "library_name: sbcli", "pipeline_tag: image-classification", "tags:"]
    lines += [f"- {tag}" for tag in tags]
    return "\n".join([*lines, "---", ""])


def class_table(state: LearnerState) -> str:
    """One row per task: its step number and class names, in label order."""
    rows = ["| step | classes |", "|---:|---|"]
    for step in range(state.steps):
        names = [n for n, t in zip(state.class_names, state.class_task, strict=True) if t == step]
        rows.append(f"| {step + 1} | {', '.join(names)} |")
    return "\n".join(rows)


def accuracy_table(history: Iterable[dict]) -> str:
    """Accuracy (%) after each step: overall, old, new and per task."""
    rows = ["| step | classes | accuracy | old | new | per task |", "|---:|---:|---:|---:|---:|---|"]
    for h in history:
        m = h["metrics"]
        per_task = " / ".join(_pct(v) for v in m["per_task"])
        rows.append(f"| {h['step']} | {h['num_classes']} | {_pct(m['overall'])} | {_pct(m['old'])} | {_pct(m['new'])} | {per_task} |")
    return "\n".join(rows)


def summary_line(history: list[dict]) -> str:
    s = history_summary(history)
    return (f"Average incremental accuracy {_pct(s['avg_incremental_2_to_T'])} % over steps 2..T (the paper's), "
            f"{_pct(s['avg_incremental_1_to_T'])} % over 1..T; last step {_pct(s['last'])} %; "
            f"forgetting {_pct(s['forgetting'])} points.")


def settings_block(state: LearnerState, inference: str, exemplars: int) -> str:
    """Method, network, data and hyperparameters, as a list."""
    norm = state.normalization
    return "\n".join([
        f"- method: `{state.method}`: {METHOD_NAMES.get(state.method, state.method)}",
        f"- inference: `{inference}`: {INFERENCE_NAMES.get(inference, inference)}",
        f"- network: {state.arch}, width x{state.width}, input {state.image_size}x{state.image_size} RGB",
        *([f"- pretrained backbone: `{json.dumps(state.provenance['pretrained'])}`"] if "pretrained" in state.provenance else []),
        f"- normalisation: mean {norm['mean']}, std {norm['std']}",
        f"- method hyperparameters: `{json.dumps(state.method_config)}`",
        f"- training: `{json.dumps(state.train_config)}`",
        f"- exemplar memory: budget {state.memory['budget']}, selection {state.memory['selection']}; "
        f"{exemplars} exemplar images included in this upload",
        f"- provenance: `{json.dumps(state.provenance)}`",
    ])


def model_card(state: LearnerState, repo_id: str, inference: str, exemplars: int, files: list[str]) -> str:
    """The README.md of ``repo_id`` holding the learner ``state`` (after its last step)."""
    step = state.steps
    memory_note = ("The exemplar memory is included, so `sb add-task` replays the old classes as it was trained to."
                   if exemplars else
                   "The exemplar memory is **not** included (it holds training images; push with `--with-memory` to "
                   "share it): `memory.safetensors` is empty, so `sb add-task` continues without replaying old classes "
                   "and forgets more than the method would with its memory.")
    parts = [
        _yaml_front_matter(state),
        f"# {repo_id.rsplit('/', maxsplit=1)[-1]}",
        "",
        f"A class-incremental image classifier grown with sbcli by "
        f"{METHOD_NAMES.get(state.method, state.method)}: {state.num_classes} classes learned in {step} task steps. "
        f"This revision holds the learner after step {step}; the branch `step-{step}` keeps it when later steps are pushed, "
        "and the branches `step-1`, `step-2`, ... hold the earlier steps that were pushed.",
        "",
        "## Classes, by the step that learned them",
        "",
        class_table(state),
        "",
        "## Method and settings",
        "",
        settings_block(state, inference, exemplars),
        "",
        "## Accuracy after each step (%)",
        "",
        accuracy_table(state.history),
        "",
        summary_line(state.history),
        "",
        "## Files",
        "",
        *[f"- `{name}`" for name in files],
        "",
        "## Continue learning",
        "",
        memory_note,
        "",
        "```",
        f"sb pull {repo_id}@step-{step} -o my-learner",
        "sb add-task my-learner ./new-classes/train --test ./new-classes/val",
        "sb evaluate my-learner",
        f"sb export my-learner --to-hub {repo_id}    # pushes main and step-{step + 1}",
        "```",
        "",
        "## Serve the ONNX file",
        "",
        f"`model.onnx` takes float32 RGB images in [0, 1], shape [batch, 3, {state.image_size}, {state.image_size}] "
        "(normalisation is inside the graph) and returns `logits` over the classes in the metadata's `class_names`.",
        "",
        "```python",
        "import json, numpy as np, onnxruntime as ort",
        "from huggingface_hub import hf_hub_download",
        "",
        f'path = hf_hub_download("{repo_id}", "model.onnx", revision="step-{step}")',
        'session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])',
        'classes = json.loads(session.get_modelmeta().custom_metadata_map["class_names"])',
        f"images = np.random.rand(4, 3, {state.image_size}, {state.image_size}).astype(np.float32)  # your images here",
        'logits = session.run(["logits"], {"images": images})[0]',
        "print([classes[i] for i in logits.argmax(1)])",
        "```",
        "",
        f"Or `sb predict model.onnx photo.jpg`. Card written by sbcli {__version__}.",
        "",
    ]
    return "\n".join(parts)
