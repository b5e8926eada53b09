"""Which onnxruntime execution provider runs a model: ``auto`` prefers TensorRT, then CUDA, then
the CPU, among the providers that actually load; an explicit one that is missing or does not load
is an error, never a silent fallback.

``onnxruntime`` (CPU, the ``sbcli[onnx]`` extra) and ``onnxruntime-gpu`` (CUDA and TensorRT,
``sbcli[onnx-gpu]``) install the same import package, so the one installed last overwrites the
other; :func:`check_runtimes` turns that mix-up into one sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from sbcli.errors import ConfigError, DataError, ExportError

PROVIDERS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
AUTO_ORDER = ("tensorrt", "cuda", "cpu")
CHOICES = ("auto", *AUTO_ORDER)
SHORT = {v: k for k, v in PROVIDERS.items()}
RUNTIMES = ("onnxruntime", "onnxruntime-gpu")
EXTRA_HINT = 'install one ONNX extra: pip install "sbcli[onnx]" (CPU) or "sbcli[onnx-gpu]" (CUDA, TensorRT)'


def installed_runtimes() -> list[str]:
    """The onnxruntime distributions installed (by their package metadata)."""
    found = []
    for name in RUNTIMES:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_runtimes(found: Sequence[str] | None = None) -> None:
    """Raises ExportError when both onnxruntime and onnxruntime-gpu are installed."""
    found = installed_runtimes() if found is None else found
    if len(found) > 1:
        raise ExportError("Both onnxruntime and onnxruntime-gpu are installed and one has overwritten the other; run "
                          "pip uninstall -y onnxruntime onnxruntime-gpu, then install one: "
                          'pip install "sbcli[onnx]" (CPU) or "sbcli[onnx-gpu]" (GPU), never both.')


def require_onnxruntime() -> Any:
    """The onnxruntime module, or ExportError naming the extras."""
    try:
        import onnxruntime
    except ImportError as err:
        raise ExportError(f"Running an ONNX model needs onnxruntime; {EXTRA_HINT}.") from err
    return onnxruntime


def candidates(requested: str, available: Sequence[str]) -> list[str]:
    """The provider list to give onnxruntime, best first.

    Raises:
        ConfigError: ``requested`` is not one of :data:`CHOICES`.
        ExportError: ``requested`` names a provider this onnxruntime does not have.
    """
    if requested not in CHOICES:
        raise ConfigError(f"--provider {requested} is unknown; choose one of: {', '.join(CHOICES)}.")
    if requested == "auto":
        return [PROVIDERS[n] for n in AUTO_ORDER if PROVIDERS[n] in available]
    wanted = PROVIDERS[requested]
    if wanted not in available:
        have = ", ".join(SHORT.get(p, p) for p in available) or "none"
        raise ExportError(f"--provider {requested} is not available in this onnxruntime (it has: {have}); "
                          f'install "sbcli[onnx-gpu]" (instead of "sbcli[onnx]") on a machine with an NVIDIA GPU, '
                          "or choose --provider cpu or auto.")
    return [wanted] if requested == "cpu" else [wanted, PROVIDERS["cpu"]]


def open_session(model: Path | bytes, requested: str = "auto", threads: int | None = None, ort: Any = None,
                 gpu: Any = None) -> tuple[Any, str]:
    """An onnxruntime session on ``model`` and the short name of the provider that runs it; ``gpu``
    (:class:`sbcli.serve.gpu.GpuOptions`) sets the CUDA and TensorRT providers' options.

    Raises:
        ExportError: onnxruntime is missing or installed twice, or the requested provider is
            missing or does not load (for ``auto``, a GPU provider that does not load is skipped).
        DataError: onnxruntime cannot read the model.
    """
    if ort is None:
        check_runtimes()
        ort = require_onnxruntime()
    providers = candidates(requested, ort.get_available_providers())
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    if any(p != PROVIDERS["cpu"] for p in providers):
        ort.set_default_logger_severity(4)  # a GPU provider that fails to load logs a red error before the fallback
    source = model if isinstance(model, Path) else "the model"
    extra = {"provider_options": gpu.provider_options(providers)} if gpu is not None else {}
    try:
        session = ort.InferenceSession(str(model) if isinstance(model, Path) else model, options, providers=providers, **extra)
    except Exception as err:  # onnxruntime raises its own untyped errors for unreadable models
        raise DataError(f"onnxruntime cannot load {source} ({type(err).__name__}: {str(err)[:300]}); "
                        "export it again with `sb export`.") from err
    chosen = session.get_providers()[0]
    if requested != "auto" and chosen != PROVIDERS[requested]:
        raise ExportError(f"--provider {requested} is installed but did not load (onnxruntime fell back to "
                          f"{SHORT.get(chosen, chosen)}); check the GPU driver, CUDA and cuDNN versions that "
                          "onnxruntime-gpu needs, or choose --provider cpu or auto.")
    return session, SHORT.get(chosen, chosen)
