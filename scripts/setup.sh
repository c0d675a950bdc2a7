#!/usr/bin/env bash
# Install what minengine needs into the active Python (a virtualenv is best), at the exact versions of
# constraints.txt (made by scripts/lock.sh). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# A CPU build of torch first: a bare "torch" requirement would pull a multi-GB CUDA build. PyTorch's CPU index
# where it is reachable; otherwise torch 2.13.0 from pip's own configuration (a local CPU wheel on our machines).
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install --quiet --timeout 15 --retries 0 torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    2>/dev/null || "$PY" -m pip install --quiet torch==2.13.0
fi
# -c: every package (and every dependency's dependency) at the version the lock names, also where an older or
# newer one is already installed, so a new machine and an old one test the same libraries
"$PY" -m pip install --quiet -c constraints.txt -r requirements.txt
"$PY" -m pip install --quiet --no-deps -e .
# The course's JupyterLab stays offline: no news / update-check pop-up reaching for the internet
"$PY" scripts/jupyter_offline.py
