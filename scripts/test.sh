#!/usr/bin/env bash
# Set up (if needed, Chromium included) and run the whole test suite on the pinned torch, then
# the compatibility subset on the other torch versions the README claims (scripts/compat.sh).
#   bash scripts/test.sh [pytest options]      (the options go to the main suite)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test || exit 1
export OMP_NUM_THREADS=1
# the compatibility venvs (GBs of downloads on a new machine) are made while the suite runs
prepare_log=$(mktemp)
bash scripts/compat.sh --prepare > "$prepare_log" 2>&1 &
prepare=$!
python3 -m pytest tests -q -rs --durations=15 "$@"
status=$?
wait $prepare || { echo "scripts/test.sh: making the compatibility venvs failed:" >&2
                   tail -20 "$prepare_log" >&2; }
if [ $status -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
bash scripts/compat.sh
compat=$?
[ $status -ne 0 ] && exit $status
exit $compat
