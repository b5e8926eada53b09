# Sourced by the scripts that run on a machine with a GPU (gpu_check.sh, own_data_gpu.sh), from the
# repository root: sets $out ($OUT if set, else ./gpu-results) and $py, installs the wheels in .whl/
# (for a machine without a package index) into /tmp/site, and puts them and the checkout on
# PYTHONPATH.
out="${OUT:-$PWD/gpu-results}"
mkdir -p "$out"
py="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    # one at a time: a wheel pip refuses (one built for another Python) is skipped with pip's reason, on stderr
    for wheel in .whl/*.whl; do
        why=$("$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$wheel" 2>&1) || echo "skipped $wheel: ${why##*$'\n'}" >&2
    done
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
