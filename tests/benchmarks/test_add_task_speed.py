"""benchmarks/add_task_speed.py without its minutes of training: the backbone file both learners start from is one
`--pretrained` takes for a full-width resnet18-in, and the script states its usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import add_task_speed as ats  # noqa: E402

sys.path.remove(str(BENCHMARKS))


def test_the_backbone_is_what_pretrained_takes_for_both_learners(tmp_path: Path) -> None:
    from sbcli.hub import pretrained

    path = ats.backbone(tmp_path / "backbone.safetensors")
    weights = pretrained.load(str(path), "resnet18-in", 1.0)
    assert weights.record["source"] == "file" and weights.record["name"] == "backbone.safetensors"
    assert not any(k.startswith("head.") for k in weights.tensors)
    assert ats.backbone(tmp_path / "again.safetensors").read_bytes() == path.read_bytes()  # seeded: the same file


def test_usage() -> None:
    out = subprocess.run([sys.executable, str(BENCHMARKS / "add_task_speed.py"), "--help"], cwd=BENCHMARKS,
                         check=True, capture_output=True, text=True, timeout=60).stdout
    assert "--per-class" in out and "--image-size" in out
