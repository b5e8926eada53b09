#!/usr/bin/env bash
# The own-data measurements on a machine with a GPU (docs/lab/benchmarks.md, "Own data at small budgets"):
# results.jsonl, environment.json and log.txt go to --out (default ./gpu-results). --wheels DIR installs
# the wheels in DIR first (a machine without a package index). Every other argument goes to
# benchmarks/own_data_gpu.py.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
source benchmarks/device_env.sh "$@"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
"$py" benchmarks/own_data_gpu.py --out "$out" "${args[@]}" 2>&1 | tee "$out/log.txt"
