"""The model card (``README.md``) pushed with a learner, written with huggingface_hub's own card
classes (``ModelCard``, ``ModelCardData``, ``EvalResult``).

Metadata: ``library_name: sbcli``, ``license``, ``pipeline_tag``, ``tags``, ``datasets`` (the
Hub ids of the public benchmarks it learned from; local class folders have none), ``metrics``
and a ``model-index`` with the accuracy after every step (all classes seen, old and new ones).
Text: what it is, what is inside (whether training images travel with it: the exemplar memory;
the held-out test sample), its classes by step, where its data came from (names and
fingerprints, never a path), settings, accuracy, the revisions that were pushed, how to continue
it, and a snippet that classifies an image file with onnxruntime, numpy and Pillow alone, its
preprocessing read from the ONNX metadata (the ``preprocess`` key).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sbcli import __version__
from sbcli.data.source_records import display_name, public_record
from sbcli.learner.records import StepRecord
from sbcli.learner.state import LearnerState
from sbcli.methods import METHODS
from sbcli.methods.rules import RULES
from sbcli.metrics import history_summary

#: The Hub dataset ids of the benchmarks sbcli reads (local class folders have no id).
HUB_DATASETS = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100", "tiny-imagenet": "zh-plus/tiny-imagenet",
                "demo": "zalando-datasets/fashion_mnist"}
TAGS = ["class-incremental", "continual-learning", "image-classification", "onnx"]


@dataclass(frozen=True)
class CardFacts:
    """What the card says beyond ``learner.json``: where it goes and what the push holds."""

    repo_id: str
    inference: str
    exemplars: int  # exemplar images included (0: the memory was left out)
    test_images: int  # held-out test images carried (test-sample.safetensors)
    files: list[str]
    branches: list[str] = field(default_factory=list)  # step-N branches on the Hub after this push
    license: str = "unknown"


def _pct(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2f}"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def tags(state: LearnerState) -> list[str]:
    """The card's tags: the field's, plus the method (``split-and-bridge`` for sb)."""
    spec = METHODS.find(state.method)
    tag = spec.hub_tag if spec is not None and spec.hub_tag else f"sbcli-{state.method}"
    return [*TAGS[:2], tag, *TAGS[2:]]


def method_title(name: str) -> str:
    """How the card names a method (its registered title, else its name)."""
    spec = METHODS.find(name)
    return spec.title if spec is not None and spec.title else name


def _sources(state: LearnerState, data_only: bool = False) -> list[dict]:
    """Each step's data record (``data_only``: the steps that brought data, not those that took classes out)."""
    return [public_record(t.source) for t in state.tasks if not (data_only and t.data_source.kind == "forget")]


def hub_datasets(state: LearnerState) -> list[str]:
    """Hub ids of the public benchmarks the learner learned from, in order, each once."""
    ids = [HUB_DATASETS[s["kind"]] for s in _sources(state, data_only=True) if s["kind"] in HUB_DATASETS]
    return list(dict.fromkeys(ids))


def _dataset(state: LearnerState, upto: int) -> tuple[str, str]:
    """(type, name) of the test data after step ``upto``: a Hub id, or ``imagefolder`` and the data's names
    (what the user called it: ``--name``, or the folder above train/ and test/)."""
    sources = [public_record(t.source) for t in state.tasks[:upto] if t.data_source.kind != "forget"]
    kinds = {s["kind"] for s in sources}
    if len(kinds) == 1 and (kind := kinds.pop()) in HUB_DATASETS:
        return HUB_DATASETS[kind], kind
    return "imagefolder", ", ".join(dict.fromkeys(display_name(s) for s in sources))


def eval_results(state: LearnerState) -> list[Any]:
    """One model-index entry per step (config ``step-N``): accuracy on all classes seen, old, new."""
    from huggingface_hub import EvalResult

    results = []
    for h in state.history:
        step, m = h.step, h.metrics
        dataset_type, dataset_name = _dataset(state, step)
        for value, what in ((m.overall, f"all {h.num_classes} classes"), (m.old, "old classes"), (m.new, "new classes")):
            if _finite(value):
                results.append(EvalResult(
                    task_type="image-classification", task_name="class-incremental image classification",
                    dataset_type=dataset_type, dataset_name=dataset_name, dataset_config=f"step-{step}",
                    dataset_split="test", metric_type="accuracy", metric_value=round(float(value), 4),
                    metric_name=f"top-1 accuracy (%) on {what} after step {step}"))
    return results


def card_data(state: LearnerState, facts: CardFacts) -> Any:
    from huggingface_hub import ModelCardData

    return ModelCardData(library_name="sbcli", license=facts.license, pipeline_tag="image-classification",
                         tags=tags(state), datasets=hub_datasets(state) or None, metrics=["accuracy"],
                         model_name=facts.repo_id.rsplit("/", maxsplit=1)[-1], eval_results=eval_results(state) or None)


def class_table(state: LearnerState) -> str:
    """One row per task: its step number and class names, in label order."""
    rows = ["| step | classes |", "|---:|---|"]
    for step in range(state.steps):
        names = [n for n, t in zip(state.class_names, state.class_task, strict=True) if t == step]
        record = state.history[step] if step < len(state.history) else None
        known, forgotten = (None, None) if record is None else (record.known_images, record.forgotten)
        more = f" ({'and ' if names else ''}{known} more images of classes learned before)" if known else ""
        more += f" (took out {', '.join(forgotten)})" if forgotten else ""
        rows.append(f"| {step + 1} | {', '.join(names) or 'no new class'}{more} |")
    return "\n".join(rows)


def source_table(state: LearnerState) -> str:
    """Each task's data as the user named it, with images per split and the content hash."""
    rows = ["| step | source | train images | test images | test set sha256 |", "|---:|---|---:|---:|---|"]
    for step, source in enumerate(_sources(state), start=1):
        train, test = source.get("train", {}), source.get("test") if isinstance(source.get("test"), dict) else {}
        count = lambda part: str(sum(part["counts"])) if "counts" in part else "-"  # noqa: E731
        if source["kind"] == "forget":
            rows.append(f"| {step} | none: classes taken out (`sb forget`) | - | - | - |")
            continue
        rows.append(f"| {step} | {source['kind']}: {display_name(source)} | {count(train)} | {count(test)} | "
                    f"{test.get('sha256', '-')[:16]} |")
    return "\n".join(rows)


def accuracy_table(history: Iterable[StepRecord]) -> str:
    """Accuracy (%) after each step: overall, old, new and per task."""
    rows = ["| step | classes | accuracy | old | new | per task |", "|---:|---:|---:|---:|---:|---|"]
    for h in history:
        m = h.metrics
        per_task = " / ".join(_pct(v) for v in m.per_task)
        rows.append(f"| {h.step} | {h.num_classes} | {_pct(m.overall)} | {_pct(m.old)} | {_pct(m.new)} | {per_task} |")
    return "\n".join(rows)


def summary_line(history: list[StepRecord]) -> str:
    s = history_summary(history)
    return (f"Average incremental accuracy {_pct(s.avg_incremental_2_to_T)} % over steps 2..T (the paper's), "
            f"{_pct(s.avg_incremental_1_to_T)} % over 1..T; last step {_pct(s.last)} %; "
            f"forgetting {_pct(s.forgetting)} points.")


def settings_block(state: LearnerState, inference: str) -> str:
    """Method, network, data and hyperparameters, as a list."""
    norm = state.norm
    return "\n".join([
        f"- method: `{state.method}`: {method_title(state.method)}",
        f"- inference: `{inference}`: {RULES.get(inference).card if inference in RULES.names() else inference}",
        f"- network: {state.arch}, width x{state.width}, input {state.image_size}x{state.image_size} RGB",
        *([f"- pretrained backbone: `{json.dumps(state.provenance.pretrained)}`"] if state.provenance.pretrained is not None else []),
        f"- normalisation: mean {list(norm.mean)}, std {list(norm.std)}",
        f"- method hyperparameters: `{json.dumps(dataclasses.asdict(state.method_config))}`",
        f"- training settings a next step starts from: `{json.dumps(dataclasses.asdict(state.train_config))}`",
        f"- exemplar memory: budget {state.memory.budget}, selection {state.memory.selection}",
        f"- provenance: `{json.dumps(state.provenance.to_json())}`",
    ])


def step_settings_table(state: LearnerState) -> str:
    """Each step's own training: its phases' epochs, and its settings where they differ from the step before."""
    rows = ["| step | phases (epochs) | training settings of this step |", "|---:|---|---|"]
    before: dict | None = None
    for h in state.history:
        phases = ", ".join(f"{p.name} {p.epochs}" for p in h.phase_reports) or "-"
        cfg = h.train_config
        if cfg is None:
            what = "not recorded (learned before sbcli kept each step's settings)"
        elif before is None:
            what = f"`{json.dumps(cfg)}`"
        else:
            changed = {k: v for k, v in cfg.items() if before.get(k) != v}
            what = f"as step {h.step - 1}, but `{json.dumps(changed)}`" if changed else f"as step {h.step - 1}"
        before = cfg if cfg is not None else before
        rows.append(f"| {h.step} | {phases} | {what} |")
    return "\n".join(rows)


def use_block(state: LearnerState) -> str:
    """Intended use and limitations, from what the learner knows of itself."""
    names = ", ".join(dict.fromkeys(display_name(s) for s in _sources(state)))
    return "\n".join([
        f"- **Intended use:** classifying images into the {state.num_classes} classes listed below, of the kind "
        f"it learned from ({names}), at {state.image_size}x{state.image_size} pixels; and growing it with "
        "more classes (`sb add-task`).",
        "- **Every image gets one of these classes.** There is no \"none of these\": an image of anything else "
        "is still put in one of them, often with a high probability.",
        "- **Accuracy is measured on the test images listed under Data only.** Photos taken elsewhere (other "
        "cameras, light, backgrounds) may score lower; check on your own images before relying on it.",
        "- **Old classes are forgotten a little at each step:** the accuracy table shows how much, per task.",
        "- **Not for decisions about people** or anything safety-critical: it was not built or tested for that.",
    ])


def inside_block(state: LearnerState, facts: CardFacts) -> str:
    """Whether training images (and test images) travel with this learner, and what follows."""
    if facts.exemplars:
        memory = (f"- **Training images inside: yes.** `memory.safetensors` holds the exemplar memory: {facts.exemplars} "
                  "training images (uint8, at the training resolution), so `sb add-task` rehearses the old classes "
                  "as the method intends.")
    else:
        memory = ("- **Training images inside: no.** The exemplar memory was left out (push with `--with-memory` to "
                  "share it): `sb add-task` on this learner refuses until you pass `--no-rehearsal`, which grows it "
                  "by distillation alone (it then forgets more than the method would with its memory).")
    cap = state.test_sample.cap if state.test_sample is not None else None
    declined = state.test_sample.declined_tasks if state.test_sample is not None else []
    if facts.test_images:
        test = (f"- **Test images inside: yes.** `test-sample.safetensors` carries {facts.test_images} held-out test "
                f"images (at most {cap} per class), so `sb evaluate` works on any machine.")
        if declined:
            test += f" The owner kept the test images of step(s) {', '.join(map(str, declined))} out (private data)."
    else:
        test = ("- **Test images inside: no.** `sb evaluate` needs the original test folders "
                "(`--data-root`) or a test folder you give it.")
    return "\n".join([memory, test])


def revisions_block(state: LearnerState, facts: CardFacts) -> str:
    """The revisions of the repository: only branches that exist after this push."""
    pushed = sorted(facts.branches, key=lambda b: int(b.split("-")[1]) if b.split("-")[-1].isdigit() else 0)
    others = [b for b in pushed if b != f"step-{state.steps}"]
    line = f"This revision holds the learner after step {state.steps} (branch `step-{state.steps}`)."
    if others:
        line += " Other pushed steps: " + ", ".join(f"`{b}`" for b in others) + "."
    return line


def usage_snippet(state: LearnerState) -> str:
    """Classify an image file with onnxruntime, numpy and Pillow; preprocessing from the metadata."""
    return "\n".join([
        "```python",
        "import json",
        "",
        "import numpy as np",
        "import onnxruntime as ort",
        "from PIL import Image, ImageOps",
        "",
        'session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])',
        "meta = session.get_modelmeta().custom_metadata_map",
        'pre, classes = json.loads(meta["preprocess"]), json.loads(meta["class_names"])',
        'with Image.open("photo.jpg") as image:  # any image file Pillow reads',
        '    rgb = ImageOps.exif_transpose(image).convert("RGB")  # EXIF orientation applied, alpha dropped',
        'size = (pre["resize"]["width"], pre["resize"]["height"])',
        "if rgb.size != size:",
        '    rgb = rgb.resize(size, getattr(Image.Resampling, pre["resize"]["filter"].upper()))',
        'x = (np.asarray(rgb, dtype=np.float32) / pre["divide_by"]).transpose(2, 0, 1)[None]  # NCHW in [0, 1]',
        'scores = session.run(None, {meta["input_name"]: x})[0][0]  # normalisation is inside the graph',
        "print(classes[int(scores.argmax())])",
        "```",
    ])


def model_card(state: LearnerState, facts: CardFacts) -> str:
    """The README.md of ``facts.repo_id`` holding the learner ``state`` (after its last step)."""
    from huggingface_hub import ModelCard

    repo_id, step = facts.repo_id, state.steps
    body = [
        f"# {repo_id.rsplit('/', maxsplit=1)[-1]}", "",
        f"A class-incremental image classifier grown with sbcli by {method_title(state.method)}: "
        f"{state.num_classes} classes learned in {step} task steps. {revisions_block(state, facts)}", "",
        "## What is inside", "", inside_block(state, facts), "",
        "## Classes, by the step that learned them", "", class_table(state), "",
        "## Data", "",
        "Each task's data as it was named when learned (never a path), with its fingerprint: a learner "
        "recognises its original test set on another machine by this hash.", "",
        source_table(state), "",
        "## Intended use and limitations", "", use_block(state), "",
        "## Method and settings", "", settings_block(state, facts.inference), "",
        "Each step's own training:", "", step_settings_table(state), "",
        "## Accuracy after each step (%)", "", accuracy_table(state.history), "", summary_line(state.history), "",
        "## Files", "", *[f"- `{name}`" for name in facts.files], "",
        "## Continue learning", "",
        "```",
        f"sb pull {repo_id}@step-{step} -o my-learner",
        "sb add-task my-learner ./new-classes/train --test ./new-classes/val" + ("" if facts.exemplars else " --no-rehearsal"),
        "sb evaluate my-learner",
        f"sb export my-learner --to-hub {repo_id}    # pushes main and step-{step + 1}",
        "```", "",
        "## Classify an image with the ONNX file", "",
        f"`model.onnx` takes float32 RGB images in [0, 1], shape [batch, 3, {state.image_size}, {state.image_size}], and "
        "returns scores over the classes in the metadata's `class_names`. With onnxruntime, numpy and Pillow alone "
        "(download `model.onnx` first, e.g. with `hf download`):", "",
        usage_snippet(state), "",
        f"Or `sb predict model.onnx photo.jpg`. Card written by sbcli {__version__}.", "",
    ]
    data = card_data(state, facts)
    return str(ModelCard("---\n" + data.to_yaml() + "\n---\n\n" + "\n".join(body)))

