"""The KV pool's size: bytes per block, how many blocks (and swap blocks) the settings and free memory allow.

Imports no torch: the model-free engine (``minengine.fleet``) sizes its pool here too.
"""

from __future__ import annotations

from dataclasses import dataclass

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import cdiv
from minengine.exceptions import VLLMValidationError

# The most blocks a pool gets when no setting sizes it: enough for every sequence slot at full length on the
# small models this engine runs, without reserving gigabytes by default.
DEFAULT_MAX_KV_BLOCKS = 2048


def kv_bytes_per_block(model, block_size: int, dtype) -> int:
    """Bytes one KV block takes over all layers: 2 (K and V) x layers x block_size x Hkv x D x the cache dtype's
    size (``dtype``, a ``torch.dtype``: 4 float32, 2 bfloat16, 1 float8 e4m3 for ``kv_cache_dtype="fp8"``). An
    FP8 cache's scales are per tensor (two floats per layer, on the model, ``layers/kv_quant.py``), not per block:
    they add 0 bytes to a block, so the same memory holds 4x the float32 blocks and 2x the bfloat16 ones."""
    return 2 * len(model.model.layers) * block_size * model.num_kv_heads * model.head_dim * dtype.itemsize


@dataclass(frozen=True)
class KVPoolSize:
    """The pool the engine allocates: ``num_blocks`` KV blocks (per rank: each rank holds its heads' slice of
    every block) and ``num_swap_blocks`` CPU swap blocks (0 unless ``preemption_mode="swap"``)."""

    num_blocks: int
    num_swap_blocks: int


def size_kv_pool(config: EngineConfig, bytes_per_block: int, device: str | None) -> KVPoolSize:
    """The KV pool of ``config`` at ``bytes_per_block`` bytes per block (one rank's), checked against free
    memory on ``device`` ("cpu" / "cuda"; None: a model-free engine, no memory to check).

    Raises:
        ValueError: the settings give less than one block, or the pool or the swap space does not fit in
            free memory (``VLLMValidationError``, naming the setting).
    """
    num_blocks = _num_blocks(config, bytes_per_block, device)
    swap_blocks = 0
    if config.preemption_mode == "swap":
        swap_blocks = num_blocks if config.swap_space_blocks is None else config.swap_space_blocks
        if config.swap_space_blocks is None and config.swap_space_bytes is not None:
            swap_blocks = config.swap_space_bytes // bytes_per_block
    if device is not None:  # CPU ranks share the host's memory; each GPU rank has its own
        ranks_per_device = config.tensor_parallel_size if device == "cpu" else 1
        check_memory(num_blocks * bytes_per_block * ranks_per_device, device, "num_kv_blocks / kv_cache_memory_bytes")
        check_memory(swap_blocks * bytes_per_block * config.tensor_parallel_size, "cpu", "swap_space_blocks")
    return KVPoolSize(num_blocks, swap_blocks)


def _num_blocks(config: EngineConfig, bytes_per_block: int, device: str | None) -> int:
    """``num_kv_blocks``; else ``kv_cache_memory_bytes`` in blocks; else every sequence slot at full length (at
    most ``DEFAULT_MAX_KV_BLOCKS``), within ``gpu_memory_utilization`` of the free memory when that is set."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory_bytes is not None:
        num_blocks = config.kv_cache_memory_bytes // bytes_per_block
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory_bytes ({config.kv_cache_memory_bytes}) is smaller than one "
                             f"KV block ({bytes_per_block} bytes)")
        return num_blocks
    num_blocks = min(DEFAULT_MAX_KV_BLOCKS, config.max_num_seqs * cdiv(config.max_model_len, config.block_size))
    if config.gpu_memory_utilization is not None and device is not None:  # vLLM's knob: of free memory
        available = available_bytes(device)
        if available is not None:
            num_blocks = min(num_blocks, int(config.gpu_memory_utilization * available) // bytes_per_block)
        if num_blocks < 1:
            raise ValueError(f"gpu_memory_utilization ({config.gpu_memory_utilization}) of the free "
                             f"{device} memory is smaller than one KV block ({bytes_per_block} bytes)")
    return num_blocks


def available_bytes(device: str) -> int | None:
    """Memory a new allocation can use on the device (CUDA: free) or in the host (CPU: psutil's "available",
    which counts reclaimable page cache, unlike MemFree), in bytes; None when it cannot be read."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    try:
        import psutil

        return psutil.virtual_memory().available
    except (ImportError, OSError, AttributeError):  # psutil missing or not on this platform
        return None


def check_memory(num_bytes: int, device: str, field: str) -> None:
    """Fail early, naming the setting, when a cache would not fit in free memory (instead of an OOM later).

    Raises:
        VLLMValidationError: ``num_bytes`` is more than the free memory of ``device``.
    """
    available = available_bytes(device)
    if available is not None and num_bytes > available:
        raise VLLMValidationError(f"{field}: the cache needs {num_bytes / 2**30:.1f} GiB but only "
                                  f"{available / 2**30:.1f} GiB of {device} memory is free")
