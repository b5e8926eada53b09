#!/usr/bin/env bash
# Issue 15's measurements on a lent GPU machine (docs/benchmarks.md, "Own data at small budgets"):
# results.jsonl, environment.json and log.txt go to $OUT (the folder the device tool brings back).
# Carried wheels (.whl/: huggingface_hub 2.x and its transport, typer, rich; see
# /work/.library/device/README.md) are installed first. Arguments go to benchmarks/own_data_gpu.py.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
"$py" benchmarks/own_data_gpu.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
