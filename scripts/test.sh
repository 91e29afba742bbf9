#!/usr/bin/env bash
# Set up (if needed, Chromium included) and run the whole test suite.
#   bash scripts/test.sh [pytest options]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test || exit 1
export OMP_NUM_THREADS=1
python3 -m pytest tests -q -rs --durations=15 "$@"
status=$?
if [ $status -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $status
