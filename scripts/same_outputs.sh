#!/bin/bash
# Byte-identical outputs across a refactor (docs/architecture.md, "Moves keep outputs"):
#
#   bash scripts/same_outputs.sh BASE_REF [WORK_DIR]
#
# runs trace-report, trace-diff and trace-whatif with the code at BASE_REF (a git worktree made
# for it) and with this checkout, on the same inputs at the same paths, and diffs the outputs
# file by file. Inputs: the suite's assets (an H100 recording, an H100 recording with its
# torch.profiler export merged, gloo and HTA exports imported) and two runs recorded here with
# this checkout (a DDP run and a GPipe pipeline of the reference GPT, 2 gloo ranks). Exit 0 when
# every output is identical, 1 when one differs (its first lines printed), 2 on a bad argument.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
base_ref=${1:-}
work=${2:-$(mktemp -d /tmp/paratrace-same-outputs.XXXXXX)}
if [ -z "$base_ref" ] || ! git -C "$here" rev-parse --verify -q "$base_ref^{commit}" >/dev/null; then
    echo "same_outputs.sh: BASE_REF ${base_ref:-(none)} is not a commit of $here" >&2
    exit 2
fi
python=${PYTHON:-python3}
base="$work/base-checkout"
out="$work/out"
rm -rf "$out"
mkdir -p "$out/base" "$out/branch" "$out/inputs"
if [ ! -d "$base" ]; then
    git -C "$here" worktree add -q --detach "$base" "$base_ref"
fi
cleanup() { git -C "$here" worktree remove --force "$base" 2>/dev/null || true; }
trap cleanup EXIT

side_root() { if [ "$1" = base ]; then echo "$base"; else echo "$here"; fi; }
# one of the commands, with a side's code first on the path, from a neutral directory
command_on() {
    local side=$1 cmd=$2; shift 2
    (cd "$work" && PYTHONPATH="$(side_root "$side")" PYTHONWARNINGS=ignore timeout 900 \
        "$python" -c "import sys
cmd = sys.argv[1]; sys.argv = [cmd] + sys.argv[2:]
if cmd == 'trace-whatif':
    from viz.whatif_cli import console
elif cmd == 'trace-diff':
    from viz.cli import diff_console as console
else:
    from viz.cli import report_console as console
sys.exit(console())" "$cmd" "$@")
}

failed=0
compare() {     # name: out/base/NAME against out/branch/NAME
    local name=$1
    if diff -r "$out/base/$name" "$out/branch/$name" > "$out/$name.diff"; then
        echo "$name: identical ($(find "$out/branch/$name" -type f | wc -l) files)"
    else
        echo "$name: DIFFERENT (diff -r in $out/$name.diff)"
        head -5 "$out/$name.diff"
        failed=1
    fi
}
# NAME INPUT|'' ARGS...: trace-report on a copy of INPUT at one path, on both sides
report() {
    local name=$1 src=$2; shift 2
    for side in base branch; do
        local dir="$out/inputs/$name"
        rm -rf "$dir"
        if [ -n "$src" ]; then cp -r "$src" "$dir"; else mkdir -p "$dir"; fi
        command_on "$side" trace-report "$dir" "$@" > "$out/$name.$side.log" 2>&1 || \
            echo "$name: trace-report exits $? on the $side side (log: $out/$name.$side.log)"
        mv "$dir" "$out/$side/$name"
    done
    compare "$name"
}
# NAME CMD ARGS...: a command that writes into --out, on both sides
written() {
    local name=$1 cmd=$2; shift 2
    for side in base branch; do
        rm -rf "$out/inputs/$name"
        command_on "$side" "$cmd" "$@" --out "$out/inputs/$name" > "$out/$name.$side.log" 2>&1 \
            || echo "$name: $cmd exits $? on the $side side (log: $out/$name.$side.log)"
        mkdir -p "$out/inputs/$name"
        cp "$out/$name.$side.log" "$out/inputs/$name/stdout-and-stderr.log"
        mv "$out/inputs/$name" "$out/$side/$name"
    done
    compare "$name"
}

# two runs recorded once, with this checkout (a recording's times differ run to run)
runs="$work/runs"
if [ ! -d "$runs/ddp/traces" ] || [ ! -d "$runs/gpipe/traces" ]; then
    rm -rf "$runs"; mkdir -p "$runs"
    tiny=(--layers 2 --hidden 32 --heads 4 --seq-len 16 --micro-batch-size 2 --microbatches 2
          --steps 3)
    (cd "$work" && PYTHONPATH="$here" "$python" -m instrument.launch --nproc-per-node 2 --no-report \
        --out "$runs/ddp" -m sample_runs.train --dp 2 --tp 1 --pp 1 "${tiny[@]}" \
        > "$runs/ddp.log" 2>&1)
    (cd "$work" && PYTHONPATH="$here" "$python" -m instrument.launch --nproc-per-node 2 --no-report \
        --out "$runs/gpipe" -m sample_runs.train --dp 1 --tp 1 --pp 2 --schedule gpipe "${tiny[@]}" \
        > "$runs/gpipe.log" 2>&1)
fi

assets="$here/tests/assets"
report ddp "$runs/ddp"
report gpipe "$runs/gpipe"
report h100-compiled "$assets/gpu-h100-recorder/compiled"
report h100-merged "$assets/gpu-h100/trace" --kineto "$assets/gpu-h100/kineto.json.gz"
report gloo-import "" --kineto "$assets/kineto-cpu-gloo"
report hta-import "" --kineto "$assets/kineto-hta/nccl_data.json.gz"
written diff trace-diff "$runs/ddp" "$runs/gpipe"
written whatif-gpt trace-whatif "$runs/gpipe" --target "--schedule 1f1b" --target "--pp 1 --dp 2"
exit $failed
