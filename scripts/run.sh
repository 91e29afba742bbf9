#!/usr/bin/env bash
# Set up (if needed) and trace the reference GPT's default configuration (4 ranks, tp 2 + sp,
# pp 2, 1F1B, 4 micro-batches, 2 steps), with memory recorded (--memory: the report's memory
# peaks; trace-run leaves it off by default, docs/overhead.md). The last line printed is the
# report's path.
#   bash scripts/run.sh [--out DIR] [more trace-run options]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec trace-run --memory "$@"
