#!/usr/bin/env bash
# What paratrace checks on a GPU, on a bare machine: python3 with torch + CUDA, pyarrow,
# networkx, jinja2, rich and pytest, but no network, no graphviz (`dot` or its Python package),
# no browser. Nothing is installed with pip: the C hot path is built in place
# (`setup.py build_ext --inplace`, where a compiler is; else the Python twin runs), the package
# runs from this checkout through PYTHONPATH, and the console scripts (trace-run, trace-report...)
# are small launchers in DIR/bin. All parts together report in under 8 minutes on one H100.
#
#   bash scripts/gpu_checks.sh [PART,...|all] [DIR]          (default: all, DIR = $OUT)
#
# Parts (docs/gpu.md says what each measured, with versions):
#   install   only the install above and versions.txt (every other part does it first)
#   tests     pytest -m gpu: device time (CUPTI directly, and Kineto's windows) attributes every
#             kernel; trace-run on one GPU (NCCL); memory against max_memory_allocated (an MLP,
#             and the reference GPT at hidden 1024)
#   trace     trace-run of the reference GPT at hidden 1024 on one GPU, 4 steps, its summary
#             (activities attributed, device compute a step; each trace's device_time: the CUPTI
#             version the C module accepted, rows lost, records dropped, foreign buffers),
#             tarred (traces.tgz); and the
#             one-line error of the 4-rank default on a machine with fewer GPUs than ranks
#   hf        the Hugging Face Trainer in one process on the GPU under trace-run --no-launcher
#   devtime   device compute a step, paratrace against a torch.profiler export of the same
#             configuration (benchmarks/gpu_device_time.py)
#   windows   what device time costs the training thread, side by side: no recorder, the
#             recorder without device time, Kineto's windows (PARATRACE_DEVICE_SOURCE=kineto) and
#             CUPTI driven directly (the default), without and with memory (the default
#             recording) (benchmarks/device_windows.py; on an H200 a step in which a window
#             closed took 347-422 ms against 141; directly, no such step, the worst 1.19x its
#             median beside a 29.9 ms drain: not run yet since the drain waits without the GIL,
#             2026-11-28)
#   overhead  the recorders side by side with each one's worst step (benchmarks/overhead.py)
#   memory    what recording memory costs on the GPU: paratrace with and without memory
#             against torch.profiler(profile_memory) (benchmarks/memory_mechanisms.py); not in
#             `all` (the six above fill one command's 10 minutes): name it
#   kineto    Kineto's windows, the fallback where the C extension or torch's libcupti is
#             missing (PARATRACE_DEVICE_SOURCE=kineto): the device-time `gpu` tests and
#             trace-run of the reference GPT at hidden 1024 with it, summarised; not in `all`
# Results go under DIR: a log per part and summary.txt (each part's exit status).
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS=${1:-all}
DIR=${2:-${OUT:?no DIR given and no \$OUT}}
[ "$PARTS" = all ] && PARTS=tests,trace,hf,devtime,windows,overhead
for part in ${PARTS//,/ }; do
    case $part in install|tests|trace|hf|devtime|windows|overhead|memory|kineto) ;;
    *) echo "gpu_checks.sh: unknown part '$part' (install, tests, trace, hf, devtime," \
            "windows, overhead, memory, kineto, all)" >&2; exit 2 ;;
    esac
done
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
status() { echo "$1 rc=$2" | tee -a "$DIR/summary.txt"; }

# ---------------------------------------------------------------------------- install
REPO=$(pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
python3 setup.py -q build_ext --inplace > "$DIR/install.log" 2>&1
status install $?
# the console scripts of setup.py, as launchers beside each other (tests look for trace-run
# beside the interpreter or on PATH)
mkdir -p "$DIR/bin"
python3 - "$DIR/bin" "$REPO" <<'EOF' >> "$DIR/install.log" 2>&1
import os, re, sys
text = open("setup.py").read()
for name, target in re.findall(r'"([a-z-]+)=([\w.]+:\w+)"', text):
    module, func = target.split(":")
    path = os.path.join(sys.argv[1], name)
    with open(path, "w") as fh:
        fh.write(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {sys.argv[2]!r})\n"
                 f"from {module} import {func}\nsys.exit({func}())\n")
    os.chmod(path, 0o755)
    print("launcher", path)
EOF
export PATH="$DIR/bin:$PATH"
{
    nvidia-smi -L 2>&1 | head -8
    python3 -c "import os, sys, torch, pyarrow, tracer.recorder.attribution.stacks as s, tracer.vocab.library as lib; print('paratrace', lib.ROOT); print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None); print('gpus', torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]); print('pyarrow', pyarrow.__version__); print('hot_path', s.StackInterner.HOT_PATH)"
    trace-run --help > /dev/null && echo "trace-run launcher ok"
} > "$DIR/versions.txt" 2>&1
status versions $?

LARGE=(--tp 1 --pp 1 --no-sp --layers 8 --heads 16 --hidden 1024 --seq-len 1024
       --micro-batch-size 4 --microbatches 2)
for part in ${PARTS//,/ }; do
    case $part in
    install) ;;
    tests)
        timeout 200 python3 -m pytest -m gpu tests -q -rfEsp -p no:cacheprovider > "$DIR/tests.log" 2>&1
        status tests $? ;;
    trace)
        run=$(mktemp -d)/gpt1024
        timeout 150 trace-run --nproc-per-node 1 --out "$run" --no-report -m sample_runs.train \
            "${LARGE[@]}" --device cuda --steps 4 > "$DIR/trace.log" 2>&1
        status trace $?
        timeout 60 python3 scripts/gpu_summary.py "$run" >> "$DIR/trace.log" 2>&1
        status trace-summary $?
        [ -d "$run" ] && tar -czf "$DIR/traces.tgz" -C "$(dirname "$run")" gpt1024
        # 4 ranks on fewer GPUs: one line naming the option, no traceback, non-zero
        timeout 60 trace-run --nproc-per-node 4 --out "$(dirname "$run")/default" --no-report \
            -m sample_runs.train --device cuda > "$DIR/fewer-gpus.log" 2>&1
        status fewer-gpus-exit $? ;;
    hf)
        run=$(mktemp -d)/hf
        mkdir -p "$run"
        timeout 150 trace-run --no-launcher --out "$run/run" --no-report \
            tests/scripts/hf_trainer.py "$run" cuda > "$DIR/hf.log" 2>&1
        status hf $?
        timeout 60 python3 scripts/gpu_summary.py "$run/run" >> "$DIR/hf.log" 2>&1
        status hf-summary $? ;;
    devtime)
        timeout 120 python3 benchmarks/gpu_device_time.py --model large --steps 5 \
            > "$DIR/devtime.log" 2>&1
        status devtime $? ;;
    windows)
        timeout 180 python3 benchmarks/device_windows.py --device cuda --model large \
            --rounds 2 --steps 30 --paths untraced,host-only,worker,cupti-direct,cupti-memory \
            > "$DIR/windows.log" 2>&1
        status windows $? ;;
    overhead)
        timeout 240 python3 benchmarks/overhead.py --device cuda --models small,large \
            --rounds 3 > "$DIR/overhead.log" 2>&1
        status overhead $? ;;
    memory)
        timeout 240 python3 benchmarks/memory_mechanisms.py --device cuda --models small,large \
            --rounds 3 --steps 4 --no-check --mechanisms \
            "profiler, profile_memory;paratrace;paratrace, memory" > "$DIR/memory.log" 2>&1
        status memory $? ;;
    kineto)
        PARATRACE_DEVICE_SOURCE=kineto timeout 200 python3 -m pytest -m gpu -q -rfEsp \
            -p no:cacheprovider tests/integration/test_device_gpu.py \
            tests/integration/test_tracer_device.py > "$DIR/kineto.log" 2>&1
        status kineto-tests $?
        run=$(mktemp -d)/kineto1024
        PARATRACE_DEVICE_SOURCE=kineto timeout 150 trace-run --nproc-per-node 1 --out "$run" \
            --no-report -m sample_runs.train "${LARGE[@]}" --device cuda --steps 4 \
            >> "$DIR/kineto.log" 2>&1
        status kineto-trace $?
        timeout 60 python3 scripts/gpu_summary.py "$run" >> "$DIR/kineto.log" 2>&1
        status kineto-summary $? ;;
    esac
done
