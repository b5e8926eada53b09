#!/usr/bin/env bash
# The GPU check in one command, on a machine with a GPU where sbcli is installed (the README's set-up,
# or --install to do it here from the package index):
#   bash benchmarks/gpu_check.sh --data PATH/tiny-imagenet-100-32px.zip [--out DIR] [gpu_check.py options]
# results.json, results.md and log.txt go to --out (default results/gpu-check); docs/lab/performance.md,
# "On a GPU", says what each step measures. Every step runs in full unless --budget-s gives the whole
# check a time limit. --wheels DIR installs the wheels in DIR first, for a machine that cannot reach a
# package index. Every other argument goes to benchmarks/gpu_check.py (--dry, --skip, --budget-s, ...).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
out="$PWD/results/gpu-check"
source benchmarks/device_env.sh "$@"
export SBCLI_CACHE="${SBCLI_CACHE:-${TMPDIR:-/tmp}/sbcli-cache}"
"$py" benchmarks/gpu_check.py --out "$out" "${args[@]}" 2>&1 | tee "$out/log.txt"
