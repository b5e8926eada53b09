#!/usr/bin/env bash
# benchmarks/own_data_defaults.py on a machine with a GPU, several runs side by side:
#   bash benchmarks/own_data_defaults.sh --study all --workers 8 --threads 2 --budget-s 3000
# The archives come from --data (default .gpu-data/ in the checkout, as for own_data_gpu.sh: the 32 px
# Tiny-ImageNet-100 and CIFAR-10 at 500 a class); results.jsonl and environment.json go to --out
# (default results/own-data-defaults); --install installs the checkout from the package index first,
# --wheels DIR the wheels in DIR (a machine that cannot reach a package index).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
out="$PWD/results/own-data-defaults"
source benchmarks/device_env.sh "$@"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
"$py" benchmarks/own_data_defaults.py --out "$out" --work "${TMPDIR:-/tmp}/sbcli-own-defaults" "${args[@]}" 2>&1 | tee "$out/log.txt"
