"""CpuSwapSpace: the CPU copy of KV blocks for swap preemption, and the block copies in and out.

Idea: vLLM v0's swap preemption (Kwon et al., SOSP 2023, section 4.5; ``CacheEngine.swap_in/swap_out``).
The scheduler decides which blocks move (``SchedulerOutput.blocks_to_swap_out`` / ``blocks_to_swap_in``,
ids only, see ``core/swap_space.py``); this class moves the bytes.
"""

from __future__ import annotations

import time

import torch

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class CpuSwapSpace:
    """Per layer a K and a V tensor of [num_blocks, block_size, Hkv, D] in CPU memory.

    Args:
        num_blocks: CPU blocks (0 allocates nothing; every preemption then recomputes).
        block_size, num_kv_heads, head_dim, dtype: as the GPU cache, so a block copies as one slice.
        num_layers: decoder layers.
    """

    def __init__(self, num_blocks: int, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.num_blocks = num_blocks
        self.caches: KVCaches = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                                 for _ in range(num_layers if num_blocks else 0)]

    def copy_blocks(self, gpu_caches: KVCaches, scheduler_output) -> float:
        """``swap`` of a step's ``blocks_to_swap_out`` and ``blocks_to_swap_in`` (a ``SchedulerOutput``)."""
        return self.swap(gpu_caches, scheduler_output.blocks_to_swap_out, scheduler_output.blocks_to_swap_in)

    def swap(self, gpu_caches: KVCaches, blocks_to_swap_out: list[tuple[int, int]],
             blocks_to_swap_in: list[tuple[int, int]]) -> float:
        """Copy (GPU, CPU) pairs out, then (CPU, GPU) pairs in, in every layer; returns the seconds taken.

        Out before in: a GPU block freed by a swap-out may be the target of a swap-in in the same step. The
        scheduler never hands a CPU block freed by a swap-in to a swap-out of the same step.
        """
        if not blocks_to_swap_out and not blocks_to_swap_in:
            return 0.0
        start = time.perf_counter()
        device = gpu_caches[0][0].device
        out_gpu = torch.tensor([g for g, _ in blocks_to_swap_out], dtype=torch.long, device=device)
        out_cpu = torch.tensor([c for _, c in blocks_to_swap_out], dtype=torch.long)
        in_cpu = torch.tensor([c for c, _ in blocks_to_swap_in], dtype=torch.long)
        in_gpu = torch.tensor([g for _, g in blocks_to_swap_in], dtype=torch.long, device=device)
        for (gpu_k, gpu_v), (cpu_k, cpu_v) in zip(gpu_caches, self.caches):
            if blocks_to_swap_out:
                cpu_k[out_cpu] = gpu_k[out_gpu].cpu()
                cpu_v[out_cpu] = gpu_v[out_gpu].cpu()
            if blocks_to_swap_in:
                gpu_k[in_gpu] = cpu_k[in_cpu].to(device)
                gpu_v[in_gpu] = cpu_v[in_cpu].to(device)
        if gpu_caches and gpu_caches[0][0].is_cuda:
            torch.cuda.synchronize()  # host-to-device copies are asynchronous: time the whole copy
        return time.perf_counter() - start
