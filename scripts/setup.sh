#!/usr/bin/env bash
# Install what minengine needs into the active Python (a virtualenv is best). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# A CPU build of torch first: a bare "torch" requirement would pull a multi-GB CUDA build. PyTorch's CPU index
# where it is reachable; otherwise torch 2.13.0 from pip's own configuration (a local CPU wheel on our machines).
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install --quiet --timeout 15 --retries 0 torch --index-url https://download.pytorch.org/whl/cpu \
    || "$PY" -m pip install --quiet torch==2.13.0
fi
"$PY" -m pip install --quiet -r requirements.txt
"$PY" -m pip install --quiet --no-deps -e .
