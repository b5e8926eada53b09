#!/usr/bin/env bash
# The own-data measurements on a machine with a GPU (docs/lab/benchmarks.md, "Own data at small budgets"):
# results.jsonl, environment.json and log.txt go to $OUT if set, else ./gpu-results. Wheels in .whl/
# (for a machine without a package index: huggingface_hub 2.x and its transport, typer, rich) are
# installed first. Arguments go to benchmarks/own_data_gpu.py.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
"$py" benchmarks/own_data_gpu.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
