#!/usr/bin/env bash
# The own-data measurements on a machine with a GPU (docs/lab/benchmarks.md, "Own data at small budgets"),
# with sbcli installed (the README's set-up, or --install to do it here from the package index):
#   bash benchmarks/own_data_gpu.sh --data DIR [--out DIR] [own_data_gpu.py options]
# results.jsonl, environment.json and log.txt go to --out (default results/own-data-gpu). --wheels DIR
# installs the wheels in DIR first, for a machine that cannot reach a package index. Every other argument
# goes to benchmarks/own_data_gpu.py (--budget-s, --workers, ...).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
out="$PWD/results/own-data-gpu"
source benchmarks/device_env.sh "$@"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
"$py" benchmarks/own_data_gpu.py --out "$out" "${args[@]}" 2>&1 | tee "$out/log.txt"
