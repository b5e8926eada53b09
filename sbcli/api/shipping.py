"""How a learner ships: ONNX, int8, Triton, the Hub, the zoo, and what a shipped model predicts (re-exported by
:mod:`sbcli.api`).

Each function loads its optional extra on use, so that importing the API needs none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sbcli.errors import ConfigError
from sbcli.learner.state import Learner, served_steps
from sbcli.learner.store.outputs import check_output_file, enclosing_learner


def export_onnx(learner_dir: Path, out: Path, *, tolerance: float = 1e-4, half: bool = False,
                opset: int | None = None, step: int | None = None, overwrite: bool = False) -> Any:
    """Write the learner at ``learner_dir`` (at kept step ``step``) as one ONNX file, checked against
    PyTorch in onnxruntime. ``out`` is never a directory or inside a learner, and an existing file
    only with ``overwrite``.

    Returns an :class:`sbcli.export.onnx.OnnxReport` (path, size, parity: max abs diff, argmax agreement).
    """
    from sbcli.export.onnx import OnnxConfig
    from sbcli.export.onnx import export_onnx as write_onnx

    cfg = OnnxConfig(tolerance=tolerance, half=half, opset=opset)  # checks the opset before loading
    check_output_file(Path(out), overwrite=overwrite)
    return write_onnx(Learner.load(learner_dir, "cpu", step), Path(out), cfg)


def export_int8(learner_dir: Path, out: Path, *, min_agreement: float = 0.98, opset: int | None = None,
                step: int | None = None, overwrite: bool = False) -> Any:
    """Write the learner (at kept step ``step``) as a statically quantised int8 ONNX file (QDQ, per-channel
    weights) calibrated on its own images; refused, nothing written, when its top-1 agrees with the float
    model on less than ``min_agreement`` of the carried test sample. Returns an Int8Report."""
    from sbcli.export.onnx import OnnxConfig
    from sbcli.export.quantize import Int8Config
    from sbcli.export.quantize import export_int8 as write_int8

    cfg, onnx_cfg = Int8Config(min_agreement=min_agreement), OnnxConfig(opset=opset)  # checked before loading
    check_output_file(Path(out), overwrite=overwrite)
    return write_int8(Learner.load(learner_dir, "cpu", step), Path(out), cfg, onnx_cfg)


def export_triton(learner_dir: Path, out: Path, *, name: str | None = None, half: bool = False,
                  opset: int | None = None, max_batch_size: int = 64, max_queue_delay_us: int = 1000) -> Any:
    """Write a Triton Inference Server model repository for the learner, one version per kept step (up
    to the current one); returns a TritonReport."""
    from sbcli.export.onnx import OnnxConfig
    from sbcli.export.triton import TritonConfig
    from sbcli.export.triton import export_triton as write_triton

    cfg = OnnxConfig(half=half, opset=opset)
    learner = enclosing_learner(Path(out).parent)
    if learner is not None:
        raise ConfigError(f"-o {out} is inside the learner at {learner}; write the model repository outside it.")
    triton = TritonConfig(name=name or Path(learner_dir).resolve().name, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us)
    steps = sorted(served_steps(Path(learner_dir)))
    learners = (Learner.load(learner_dir, "cpu", n) for n in steps)  # one at a time
    return write_triton(learners, Path(out), cfg, triton)


def push(learner_dir: Path, repo_id: str, *, with_memory: bool = False, private: bool = False,
         token: str | None = None, endpoint: str | None = None, license: str = "unknown") -> Any:
    """Push the learner, its ONNX file and a model card to ``repo_id`` (``main`` and branch ``step-N``).

    Without ``with_memory`` the exemplar memory stays home and the card says so; ``license`` is the
    card's license id."""
    from sbcli.hub.client import HubConfig
    from sbcli.hub.client import push as push_learner

    return push_learner(Path(learner_dir), repo_id, with_memory=with_memory, private=private,
                        cfg=HubConfig(endpoint=endpoint, token=token), license=license)


def pull(ref: str, out: Path | None = None, *, index: Path | None = None, offline: bool = False,
         timeout: float = 10.0, token: str | None = None, endpoint: str | None = None, data: Path | None = None,
         on_progress: Any = None) -> Any:
    """Fetch a zoo entry or ``OWNER/NAME[@REVISION]`` into ``out``, verified; returns a PullReport. A backbone
    entry becomes a learner with no classes yet (:func:`sbcli.run.backbone_learner.pull_backbone`); an entry built on this
    machine is learned from ``data`` by its recipe (:func:`sbcli.run.zoo_build.build_entry`)."""
    from sbcli.hub.client import HubConfig
    from sbcli.hub.pull import backbone_entry, built_entry, default_target, parse_ref
    from sbcli.hub.pull import pull as pull_learner

    cfg = HubConfig(endpoint=endpoint, token=token, timeout=timeout, offline=offline)
    built = built_entry(ref, index)
    if built is not None:
        from sbcli.run.zoo_build import build_entry  # learned here from the weight package and the user's data

        return build_entry(*built, Path(data) if data is not None else None,
                           Path(out) if out is not None else default_target(parse_ref(ref)), on_progress)
    if data is not None:
        raise ConfigError(f"--data is for a zoo entry that is built on this machine (sb pull --list); {ref} is "
                          "downloaded or installed as it is: drop --data.")
    backbone = backbone_entry(ref, index)
    if backbone is None:
        return pull_learner(ref, out, index=index, cfg=cfg)
    from sbcli.run.backbone_learner import pull_backbone  # pretrained weights made into a learner with no classes yet

    parsed = parse_ref(ref)
    return pull_backbone(*backbone, parsed.revision, Path(out) if out is not None else default_target(parsed), cfg)


def zoo(index: Path | None = None) -> list[Any]:
    """The zoo's entries (:class:`sbcli.hub.zoo.ZooEntry`), from the bundled index or ``index``."""
    from sbcli.hub.zoo import load_index

    return list(load_index(index).entries.values())


def predict(model: Path, images: list[Path], *, top_k: int = 5, batch_size: int = 64, device: str = "auto") -> list[Any]:
    """Top-k labels and probabilities (:class:`sbcli.serve.predict.Prediction`) of a learner or ONNX file."""
    from sbcli.export.serving import open_learner
    from sbcli.serve.predict import predict as predict_images

    return predict_images(Path(model), images, top_k=top_k, batch_size=batch_size, device=device,
                          open_learner=open_learner).predictions
