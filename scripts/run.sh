#!/usr/bin/env bash
# Set up (if needed) and trace the reference GPT's default configuration (4 ranks, tp 2 + sp,
# pp 2, 1F1B, 4 micro-batches, 2 steps), memory included (trace-run records it by default: the
# report's memory peaks). The last line printed is the report's path.
#   bash scripts/run.sh [--out DIR] [more trace-run options]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec trace-run "$@"
