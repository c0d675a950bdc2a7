#!/usr/bin/env bash
# Install what minengine needs into the active Python (use a virtualenv if you like). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# CPU torch first: a bare "torch" requirement would pull a multi-GB CUDA build.
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install --quiet torch==2.13.0 || "$PY" -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -m pip install --quiet -r requirements.txt
"$PY" -m pip install --quiet --no-deps -e .
