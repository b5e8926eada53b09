#!/usr/bin/env bash
# The GPU check in one command (docs/lab/performance.md, "On a GPU"): results.json, results.md and
# log.txt go to $OUT if set, else ./gpu-results. Wheels in .whl/ (for a machine without a package
# index) are installed first, if there are any.
# Any argument is passed on to benchmarks/gpu_check.py (e.g. --dry, --skip sequence, --budget-s 540).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
source benchmarks/device_env.sh
export SBCLI_CACHE="${SBCLI_CACHE:-/tmp/sbcli-cache}"
"$py" benchmarks/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
