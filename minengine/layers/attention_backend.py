"""Which attention backend runs: ``EngineConfig.attention_backend`` (vLLM's ``--attention-backend``) resolved
once, when the ``ModelRunner`` is built, for its device, model dtype, head size and cache dtype. Every step's
``ForwardBatch`` then carries the name and ``layers/attention.paged_attention`` runs that backend.
"""

from __future__ import annotations

import logging

import torch

from minengine.config import ATTENTION_BACKENDS
from minengine.layers import cpu_attention

logger = logging.getLogger(__name__)


def resolve_attention_backend(name: str, device: torch.device | str, dtype: torch.dtype, head_dim: int,
                              kv_cache_dtype: torch.dtype | None = None) -> str:
    """The backend that runs for ``name`` on this device, model dtype, head_dim and cache dtype.

    "auto": "triton" on CUDA where Triton is installed; on a CPU "cpu" where the C++ kernel takes the model
    (``cpu_attention.applies``) unless ``MINENGINE_CPU_KERNEL=0`` (then "reference"); "reference" otherwise.
    An FP8 cache on a GPU older than sm_89 gets "reference" instead of "triton" (Triton cannot convert it there).

    Raises:
        ValueError: ``name`` is not one of ``ATTENTION_BACKENDS``, or "cpu" on a CUDA device.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}; got {name!r}")
    device = torch.device(device)
    if name == "cpu" and device.type != "cpu":
        raise ValueError(f"attention_backend 'cpu' (the C++ kernel) runs on a CPU, not on {device.type}")
    if name == "auto" and device.type == "cuda":
        from minengine.layers.triton_attention import triton_available

        name = "triton" if triton_available() else "reference"
    elif name == "auto":
        name = "cpu" if cpu_attention.applies(device, dtype, head_dim, kv_cache_dtype) else "reference"
    if (name == "triton" and kv_cache_dtype == torch.float8_e4m3fn and device.type == "cuda"
            and torch.cuda.get_device_capability(device) < (8, 9)):
        logger.warning("minengine: an FP8 KV cache needs compute capability 8.9+ for the Triton attention; "
                       "using the reference attention")
        name = "reference"
    return name
