# Sourced by the scripts that run on a machine with a GPU (gpu_check.sh, own_data_gpu.sh), from the
# repository root: sets $out ($OUT if set, else ./gpu-results) and $py, installs the wheels in .whl/
# (for a machine without a package index) into /tmp/site, and puts them and the checkout on
# PYTHONPATH.
out="${OUT:-$PWD/gpu-results}"
mkdir -p "$out"
py="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
