#!/usr/bin/env bash
# Set up, then run the whole test suite on the CPU (Triton kernels through the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
python3 -m ruff check minengine tests scripts benchmarks app.py pages
# -n auto --dist loadscope: one worker per core, each test module on one worker (its module fixtures built once)
python3 -m pytest -q -n auto --dist loadscope "$@"
