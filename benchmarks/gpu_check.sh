#!/usr/bin/env bash
# The GPU check in one command (docs/performance.md, "On a GPU"): results.json, results.md and
# log.txt go to $OUT (the folder the device tool brings back), else ./gpu-results.
# Carried wheels (.whl/, see /work/.library/device/README.md) are installed first, if there are any.
# Any argument is passed on to benchmarks/gpu_check.py (e.g. --dry, --skip sequence, --budget-s 540).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-$PWD/gpu-results}"
mkdir -p "$out"
py="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SBCLI_CACHE="${SBCLI_CACHE:-/tmp/sbcli-cache}"
"$py" benchmarks/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
