#!/usr/bin/env bash
# The compatibility subset on the torch and Python versions the README claims, each in a venv of
# its own: the oldest torch on the oldest Python (the hot path's Python twin: no C extension
# before CPython 3.11), the GPU machines' torch 2.11 on Python 3.12, and the newest torch this
# machine's registry serves on the newest Python. The venvs are cached between runs under
# $PARATRACE_VENVS (default ~/.cache/paratrace/venvs) and made when missing or broken: a full
# CUDA build of torch each (about 4.7 GB, a minute or two to install), run on the CPU.
#
#   bash scripts/compat.sh [TORCH ...]        (default: every version below; e.g. 2.11.0)
#   bash scripts/compat.sh --prepare          (only make the missing venvs: test.sh runs this
#                                              beside the main suite, then the subset after it)
#   bash scripts/compat.sh --whole [TORCH ...] (the whole suite instead, by hand: docs/compat.md)
#
# The subset (docs/compat.md): the recorder on DDP, FSDP2, checkpointing, an optimizer closure,
# a custom Function, pipelining, DTensor, torch.compile and higher-order ops; a thread with no
# Python frame (autograd's CUDA device threads); trace-run of plain c10d, DTensor TP, pipelining
# and the reference GPT; the Kineto import; device windows through Kineto's binding, with a
# user's torch.profiler among them (CPU activity); CUPTI driven directly (its record layouts against
# the CUDA builds' own CUPTI headers, their libcupti loaded); the collective counts of the reference GPT and
# of DDP/FSDP2 equal to the pinned torch's (tests/integration/test_compat_counts.py runs both interpreters);
# every attribute a trace replaces in torch put back after it; and qualified function names
# (read from the source on Python 3.10).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENVS=${PARATRACE_VENVS:-$HOME/.cache/paratrace/venvs}
# torch version, then the Python it runs on (major.minor)
MATRIX=("2.10.0 3.10" "2.11.0 3.12" "2.14.1 3.13")
DEPS=("pyarrow>=14" "networkx>=3" "graphviz>=0.20" "jinja2>=3" "numpy" "rich>=12" "pytest>=7"
      "pytest-timeout>=2" "dask[distributed]>=2023.1" "setuptools>=64" "wheel")
I=tests/integration
SUBSET=($I/test_tracer_threads.py $I/test_phases_apis.py $I/test_phases_pipelining.py
        $I/test_phases_dtensor.py $I/test_phases_compile.py $I/test_hops_single.py
        $I/test_trace_run.py $I/test_kineto_import.py $I/test_compat_counts.py
        $I/test_dimensions_runs.py $I/test_memory_recording.py $I/test_memory_frameworks.py
        $I/test_tracer_device.py tests/unit/test_cupti_direct.py $I/test_cupti_layout.py
        $I/test_device_direct.py $I/test_cupti_standin.py $I/test_cupti_standin_runs.py
        $I/test_patches_process.py
        tests/unit/test_qualnames.py tests/unit/test_hotpath_onop.py
        tests/unit/test_user_profiler.py)
# the pinned torch's interpreter (setup.sh's), and a cache of its collective counts for the
# venvs' runs of tests/integration/test_compat_counts.py
PINNED_PYTHON=$(${PYTHON:-python3} -c 'import sys; print(sys.executable)')
PINNED_CACHE=$(mktemp -d)
trap 'rm -rf "$PINNED_CACHE"' EXIT
prepare=0
WHAT="the compatibility subset"
if [ "${1:-}" = "--prepare" ]; then prepare=1; shift; fi
if [ "${1:-}" = "--whole" ]; then
    # the whole suite instead of the subset, but for the files that need test extras the venvs
    # lack (transformers, Lightning, duckdb): by hand, not in CI (14-16 min a venv here)
    SUBSET=(tests --deselect $I/test_frameworks.py --deselect $I/test_report_sql.py)
    WHAT="the whole suite"
    shift
fi
wanted=("$@")

find_python() {   # an interpreter of version $1 (major.minor) that runs: on PATH, or pyenv's
    local found       # (a pyenv shim is on PATH for every version it has, but runs only the
                      # versions pyenv has made active: each one found is tried)
    for found in "$(command -v "python$1" 2>/dev/null)" \
                 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python"$1"; do
        [ -n "$found" ] && [ -x "$found" ] && "$found" -c 'import sys' >/dev/null 2>&1 &&
            { echo "$found"; return 0; }
    done
    return 1
}

venv_ok() {       # the venv has this torch and every dependency
    "$1/bin/python" - "$2" <<'EOF' >/dev/null 2>&1
import sys, torch, pyarrow, networkx, graphviz, jinja2, numpy, rich, pytest, pytest_timeout
import dask.distributed
sys.exit(torch.__version__.split("+")[0] != sys.argv[1])
EOF
}

failed=()
for entry in "${MATRIX[@]}"; do
    set -- $entry
    torch_version=$1 py=$2
    if [ ${#wanted[@]} -gt 0 ] && [[ ! " ${wanted[*]} " == *" $torch_version "* ]]; then
        continue
    fi
    venv="$VENVS/torch-$torch_version-py$py"
    label="torch $torch_version, Python $py"
    if ! venv_ok "$venv" "$torch_version"; then
        interpreter=$(find_python "$py") || {
            echo "scripts/compat.sh: no Python $py on this machine (PATH or pyenv)" >&2
            failed+=("$label: no Python $py"); continue; }
        echo "scripts/compat.sh: making the venv of $label ($venv)"
        rm -rf "$venv"
        "$interpreter" -m venv "$venv" &&
            "$venv/bin/python" -m pip install -q "torch==$torch_version" "${DEPS[@]}" || {
            failed+=("$label: the venv could not be made"); continue; }
    fi
    [ $prepare -eq 1 ] && continue
    # this checkout, without dependencies and without the index (its C hot path built where
    # the Python has one)
    if ! "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index \
            -e "$REPO" > "$venv/install.log" 2>&1; then
        tail -5 "$venv/install.log" >&2
        failed+=("$label: paratrace did not install"); continue
    fi
    echo "scripts/compat.sh: $WHAT on $label"
    PATH="$venv/bin:$PATH" OMP_NUM_THREADS=1 PARATRACE_PINNED_PYTHON="$PINNED_PYTHON" \
        PARATRACE_PINNED_CACHE="$PINNED_CACHE" \
        "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs "${SUBSET[@]}"
    status=$?
    [ $status -eq 0 ] || failed+=("$label: pytest exited $status")
done
if [ ${#failed[@]} -gt 0 ]; then
    printf 'scripts/compat.sh: %s\n' "${failed[@]}" >&2
    exit 1
fi
