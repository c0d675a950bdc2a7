"""vLLM's ``cleanup_dist_env_and_memory``, for scripts that call it between engines. minengine runs on one
device with no process group, so it only releases memory."""

from __future__ import annotations

import gc


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    """Collect garbage and return cached CUDA memory (``shutdown_ray`` is accepted and ignored)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
