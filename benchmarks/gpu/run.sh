#!/usr/bin/env bash
# The GPU path on one H100/H200, nothing to download, under 8 minutes: correctness (fp32 greedy vs transformers,
# bf16 agreement, Triton vs reference), decode step time vs batch size against the HBM roofline, throughput vs
# transformers static batching. Prints one table; writes the JSON to $OUT/gpu.json (the device machine's
# output folder) or benchmarks/results/gpu.json. Extra arguments go to run.py (e.g. --device cpu --tiny).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [[ " $* " != *" --device cpu "* ]]; then
  unset TRITON_INTERPRET  # compiled kernels on the GPU
fi
out="${OUT:-benchmarks/results}/gpu.json"
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'triton', triton.__version__)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec timeout 470 python3 benchmarks/gpu/run.py --out "$out" "$@"
