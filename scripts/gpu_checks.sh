#!/usr/bin/env bash
# What paratrace checks on a GPU, in parts that each fit in one 10-minute command on a bare
# machine with torch, pyarrow, networkx, jinja2 and pytest but no graphviz, browser or network.
# Results go under DIR (default $OUT): a log per part, summary.txt (each part's exit status) and
# traces.tgz (the trace part's run directory, to build its report where graphviz is).
#
#   bash scripts/gpu_checks.sh PART[,PART...] [DIR]
#
# tests,trace fit in one command (at most 480 s), overhead in another (540 s).
# Parts (docs/gpu.md and docs/overhead.md say what each measures):
#   tests     pytest -m gpu: CUPTI windows attribute every kernel; trace-run on one GPU, NCCL
#   overhead  issue 15's ratios on the small and hidden-1024 reference GPT (benchmarks/overhead.py)
#   trace     trace-run --no-report of the small reference GPT on the GPU, tarred; and the
#             one-line error of the 4-rank default on a machine with fewer GPUs than ranks
# Every call first installs paratrace (editable, offline; builds the C hot path where a compiler
# is) and writes versions.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS=${1:?usage: bash scripts/gpu_checks.sh tests,overhead,trace [DIR]}
DIR=${2:-${OUT:?no DIR given and no \$OUT}}
for part in ${PARTS//,/ }; do
    case $part in tests|overhead|trace) ;;
    *) echo "gpu_checks.sh: unknown part '$part' (tests, overhead, trace)" >&2; exit 2 ;;
    esac
done
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1
SMALL=(--tp 1 --pp 1 --no-sp --layers 4 --heads 4 --hidden 256 --seq-len 256
       --micro-batch-size 4 --microbatches 2)

# the console script beside the interpreter (as tests/test_device_gpu.py finds it)
TRACE_RUN="$(python3 -c 'import os, sys; print(os.path.dirname(sys.executable))')/trace-run"
status() { echo "$1 rc=$2" | tee -a "$DIR/summary.txt"; }

rm -f tracer/_hotpath*.so
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$DIR/install.log" 2>&1
status install $?
{
    nvidia-smi -L
    python3 -c "import sys, torch, pyarrow, tracer.stacks as s; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None); print('gpus', torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]); print('pyarrow', pyarrow.__version__); print('hot_path', s.StackInterner.HOT_PATH)"
} > "$DIR/versions.txt" 2>&1

for part in ${PARTS//,/ }; do
    case $part in
    tests)
        timeout 240 python3 -m pytest -m gpu tests -q -p no:cacheprovider > "$DIR/tests.log" 2>&1
        status tests $? ;;
    overhead)
        timeout 540 python3 benchmarks/overhead.py --device cuda --models small,large \
            --rounds 5 > "$DIR/overhead.log" 2>&1
        status overhead $? ;;
    trace)
        run=$(mktemp -d)/small
        timeout 180 "$TRACE_RUN" --nproc-per-node 1 --out "$run" --no-report -m sample_runs.train \
            "${SMALL[@]}" --device cuda --steps 4 > "$DIR/trace.log" 2>&1
        status trace $?
        [ -d "$run" ] && tar -czf "$DIR/traces.tgz" -C "$(dirname "$run")" small
        # 4 ranks on fewer GPUs: one line naming the option, no traceback, non-zero
        timeout 60 "$TRACE_RUN" --nproc-per-node 4 --out "$(dirname "$run")/default" --no-report \
            -m sample_runs.train --device cuda > "$DIR/fewer-gpus.log" 2>&1
        status fewer-gpus-exit $? ;;
    esac
done
