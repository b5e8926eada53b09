# Sourced, with the script's arguments, by the benchmarks for a machine with a GPU (gpu_check.sh,
# own_data_gpu.sh), from the repository root, after the script has set $out to its own default folder.
# Takes out of the arguments:
#   --out DIR      where the results go (default: the script's own folder under results/); made, passed on as --out DIR
#   --install      first install this checkout with its `onnx` extra from the package index (pip install -e ".[onnx]")
#   --wheels DIR   first install the wheels in DIR instead (a machine that cannot reach a package index),
#                  into a folder of their own that goes on PYTHONPATH
# and leaves the other arguments in the array "args". Sets $out and $py ($PYTHON, else python3), and
# puts the checkout on PYTHONPATH.
out="${out:-$PWD/results/gpu}"
wheels=""
install=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --out=*) out="${1#--out=}"; shift ;;
        --install) install=1; shift ;;
        --wheels) wheels="$2"; shift 2 ;;
        --wheels=*) wheels="${1#--wheels=}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
mkdir -p "$out"
py="${PYTHON:-python3}"
if [ -n "$install" ]; then
    "$py" -m pip install -q -e ".[onnx]" || exit 1
fi
if [ -n "$wheels" ]; then
    site="${TMPDIR:-/tmp}/sbcli-wheels-site"
    # one at a time: a wheel pip refuses (one built for another Python) is skipped with pip's reason, on stderr
    for wheel in "$wheels"/*.whl; do
        [ -e "$wheel" ] || { echo "no wheels in $wheels" >&2; break; }
        why=$("$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$wheel" 2>&1) || echo "skipped $wheel: ${why##*$'\n'}" >&2
    done
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
