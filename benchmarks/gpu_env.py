"""The environment report of every GPU-machine script (gpu_check.py, own_data_gpu.py): one function, one shape.

Python, torch, CUDA, cuDNN, NCCL, each GPU (name, capability, memory), the packages sbcli needs (imported,
with versions, or why not), WebP decoding (the 32 px Tiny-ImageNet-100 archive is WebP) and whether
``python -m sbcli --help`` runs. Every figure a GPU run reports is stated beside this.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import subprocess
import sys

# import name -> distribution name
PACKAGES = {"torch": "torch", "torchvision": "torchvision", "typer": "typer", "rich": "rich", "numpy": "numpy",
            "PIL": "pillow", "safetensors": "safetensors", "onnx": "onnx", "onnxscript": "onnxscript",
            "onnxruntime": "onnxruntime", "huggingface_hub": "huggingface-hub", "pytest": "pytest",
            "matplotlib": "matplotlib"}


def environment() -> dict:
    """The report, as a JSON-able dict."""
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(), "packages": {}, "missing": []}
    if torch.cuda.is_available():
        env["gpus"] = [{"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i)),
                        "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                       for i in range(torch.cuda.device_count())]
        env["cudnn"] = torch.backends.cudnn.version()
        env["nccl"] = str(torch.cuda.nccl.version()) if torch.distributed.is_nccl_available() else None
        env["bf16"] = torch.cuda.is_bf16_supported(including_emulation=False)
        env["driver"] = nvidia_smi("driver_version")
    for module, dist in PACKAGES.items():
        try:
            importlib.import_module(module)
            env["packages"][dist] = importlib.metadata.version(dist)
        except Exception as err:  # noqa: BLE001  (any import failure is what we report)
            env["missing"].append(f"{dist} ({type(err).__name__}: {err})")
    from PIL import features

    env["webp"] = bool(features.check("webp"))
    done = subprocess.run([sys.executable, "-m", "sbcli", "--help"], capture_output=True, text=True, timeout=120,
                          check=False)
    env["sbcli_help"] = "ok" if done.returncode == 0 else f"exit {done.returncode}: {(done.stdout + done.stderr)[-500:]}"
    return env


def nvidia_smi(field: str) -> str | None:
    """One ``nvidia-smi --query-gpu`` field of the first GPU, or None where nvidia-smi is not there."""
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
