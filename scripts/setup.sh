#!/usr/bin/env bash
# Installs everything paratrace needs on a fresh Debian machine with Python >= 3.9 (idempotent):
# graphviz's dot, a C compiler (the recorder's C hot path, tracer/recorder/csrc/hotpath/; and
# torch.compile's C++ for the tests) and Chromium (tests only) from Debian, the CPU build of torch
# 2.13.0 and the package itself (editable, with test extras: the frameworks the suite traces among
# them, its C extension built) from PyPI.
#   bash scripts/setup.sh          # what trace-run needs
#   bash scripts/setup.sh --test   # plus Chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
# the C hot path needs a compiler and Python's headers (without them it installs in Python)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
$PY -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || need_apt+=(python3-dev)
if [ "${1:-}" = "--test" ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  # torch.compile's inductor builds its CPU kernels with a C++ compiler (test_phases_compile)
  command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# torch is pinned here (a CPU build on this machine's kind); any torch >= 2.4 works elsewhere
if ! $PY -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  $PY -m pip install -q "torch==2.13.0"
fi
$PY -m pip install -q -e ".[test]"
# the test extras hold the traced frameworks (transformers, accelerate, lightning), pinned to
# versions torch 2.13.0 satisfies; a resolver that swapped torch anyway would cost GBs of CUDA
$PY -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' || {
  echo "scripts/setup.sh: installing the extras replaced torch 2.13.0; reinstall it" >&2; exit 1; }
