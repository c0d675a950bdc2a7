"""ModelRunner: owns the paged KV cache tensors, runs one step of the model and samples."""

from __future__ import annotations

import logging

import torch

from minengine.core.scheduler_output import SchedulerOutput
from minengine.layers import cpu_attention
from minengine.layers.attention_backend import resolve_attention_backend
from minengine.models.llama import LlamaForCausalLM
from minengine.worker.block_table import BlockTable
from minengine.worker.cuda_graphs import DecodeGraphs, capture_sizes_for
from minengine.worker.forward_batch import ForwardBatch
from minengine.worker.host_memory import retain_freed_memory
from minengine.worker.kv_pool import kv_bytes_per_block  # noqa: F401  (the course imports it from here)
from minengine.worker.sampler import Sampler
from minengine.worker.swap import CpuSwapSpace
from minengine.worker.token_logprobs import TokenLogprobs, compute_prompt_logprobs

logger = logging.getLogger(__name__)


def _no_swapped_blocks(kv_caches, scheduler_output: SchedulerOutput) -> float:
    """Without a swap space no step moves a block: 0 seconds."""
    return 0.0


class ModelRunner:
    """Runs ``SchedulerOutput`` steps on a model with a paged KV cache.

    Args:
        model: the loaded model.
        num_blocks, block_size: shape of the KV pool; each layer gets a K and a V tensor of
            [num_blocks, block_size, Hkv, D] in the model's dtype (one block more with ``cuda_graphs``).
        seed: seed of the sampler's shared generator.
        num_swap_blocks: CPU swap-space blocks for swap preemption (0 = none).
        attention_backend: ``EngineConfig.attention_backend``, resolved here once
            (``layers/attention_backend.resolve_attention_backend``): "reference" (the Python paged read), "cpu"
            (minengine's C++ kernel, ``layers/cpu_attention.py``, started here and built in the background; the
            reference runs until it is ready), "triton" (the paged-attention kernel); "auto" or None: "triton" on
            CUDA with Triton installed, "cpu" on a CPU where the kernel takes the model, else "reference".
        cuda_graphs: replay decode-only steps from CUDA graphs (``worker/cuda_graphs.py``); None = on for CUDA
            with the Triton attention, unless the model says it cannot (``supports_cuda_graphs``: MoE). True on
            a CPU runs the same padded static-buffer path eagerly (tests). Needs the Triton attention; one extra KV
            block is allocated as the padding rows' sink.
        max_num_seqs: the largest decode batch a graph is captured for (larger steps run eagerly).
        kv_cache_dtype: the KV tensors' dtype; None = the model's. ``torch.float8_e4m3fn`` is the FP8 cache
            (``kv_cache_dtype="fp8"``, ``layers/kv_quant.py``), read by every attention path.
        logits_processors: the engine's custom logits processors (``worker/logits_processors.py``) or None.
        enforce_eager: vLLM's name: False compiles decode steps (``worker/compiled_decode.py``); True / None: eager.

    Attributes:
        last_swap_time_s: seconds the last ``execute`` spent copying KV blocks to and from the swap space.
        last_logprobs: {request_id: [TokenLogprobs of each token it got]} of the last ``execute``, for
            requests with ``logprobs``; last_prompt_logprobs: {request_id: (first prompt index,
            [TokenLogprobs])} of the prompt tokens its prefill chunks scored, for requests with
            ``prompt_logprobs``.
        block_table: the running requests' block tables, kept between steps (``BlockTable``).
    """

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, seed: int = 0,
                 num_swap_blocks: int = 0, attention_backend: str | None = None, cuda_graphs: bool | None = None,
                 max_num_seqs: int = 512, kv_cache_dtype: torch.dtype | None = None,
                 logits_processors=None, enforce_eager: bool | None = None):
        self.model = model
        self.block_size = block_size
        p = next(p for p in model.parameters() if p.is_floating_point())  # int8 weights: the activations' dtype
        self.device, self.dtype = p.device, p.dtype
        self.kv_cache_dtype = kv_cache_dtype or self.dtype
        self.attention_backend = resolve_attention_backend(attention_backend or "auto", self.device, self.dtype,
                                                           model.head_dim, self.kv_cache_dtype)
        if self.device.type == "cpu":
            retain_freed_memory()  # per-step temporaries would otherwise page-fault (worker/host_memory.py)
        if self.attention_backend == "cpu":
            # a cached build loads now; a compile or another process's build goes on in the background (at
            # most START_WAIT_S here) while the steps run the reference path, never in a request's TTFT
            cpu_attention.start()
        self.block_table = BlockTable()
        if cuda_graphs is None:
            cuda_graphs = (self.device.type == "cuda" and self.attention_backend == "triton"
                           and getattr(model, "supports_cuda_graphs", True))
        if cuda_graphs and self.attention_backend != "triton":
            raise ValueError("cuda_graphs needs attention_backend='triton'")
        # The graphs' padding rows write into one extra block that the scheduler never hands out.
        shape = (num_blocks + (1 if cuda_graphs else 0), block_size, model.num_kv_heads, model.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device),
                           torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device))
                          for _ in model.model.layers]
        self.logits_processors = logits_processors
        self.sampler = Sampler(seed, logits_processors)
        # Swap preemption's door: its CPU blocks and the copies before each forward (none without a swap space).
        self.swap_space = None
        self.copy_swapped_blocks = _no_swapped_blocks
        if num_swap_blocks:
            self.swap_space = CpuSwapSpace(num_swap_blocks, len(self.kv_caches), block_size, model.num_kv_heads,
                                           model.head_dim, self.kv_cache_dtype)
            self.copy_swapped_blocks = self.swap_space.copy_blocks
        self.last_swap_time_s = 0.0
        self.last_logprobs: dict[str, list[TokenLogprobs]] = {}
        self.last_prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] = {}
        self.graphs = None
        if cuda_graphs:
            max_blocks = min(num_blocks, -(-model.config.max_position_embeddings // block_size))
            self.graphs = DecodeGraphs(model, self.kv_caches, block_size, max_blocks, pad_block=num_blocks,
                                       sizes=capture_sizes_for(max_num_seqs), capture=self.device.type == "cuda")
            self.graphs.capture_all()  # at start-up, not in the middle of serving (a no-op without CUDA)
        elif enforce_eager is False and self.device.type == "cpu":  # asked for: compiled decode steps
            from minengine.worker.compiled_decode import compiled_decode  # None where it does not apply

            self.graphs = compiled_decode(model, self.kv_caches, enforce_eager, self)

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> dict[str, list[int]]:
        """Compute one step; returns {request_id: the tokens it gets} for the requests that sample: one token,
        or for a decode verifying k proposals its accepted proposals plus one (1 to k + 1 tokens, see
        ``Sampler``). Speculative steps run eagerly (a CUDA graph replays decode-only steps of one token per
        request).

        The step's swap-outs and swap-ins are copied first: the forward may overwrite swapped-out blocks and
        reads swapped-in ones."""
        self.last_swap_time_s = self.copy_swapped_blocks(self.kv_caches, scheduler_output)
        self.last_logprobs, self.last_prompt_logprobs = {}, {}
        if scheduler_output.is_empty:
            return {}
        batch = self.prepare_inputs(scheduler_output)
        if self.graphs is not None and self.graphs.supports(batch):
            hidden = self.graphs.run(batch)
        else:
            if self.graphs is not None:
                self.graphs.num_eager_fallbacks += 1
            hidden = self.model(batch, self.kv_caches)
        if any(s.sampling_params.prompt_logprobs is not None for s in scheduler_output.scheduled):
            self.last_prompt_logprobs = compute_prompt_logprobs(
                self.model.compute_logits, hidden, batch.first_rows.tolist(), scheduler_output.scheduled)
        sampling = [s for s in scheduler_output.scheduled if s.sample]
        if not sampling:
            return {}
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        tokens = self.sampler(logits, sampling)
        self.last_logprobs = self.sampler.last_logprobs
        return {s.request_id: t for s, t in zip(sampling, tokens)}

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> ForwardBatch:
        """The step's ``ForwardBatch`` (host-side input preparation; updates the persistent block table)."""
        return ForwardBatch.build(scheduler_output, self.block_size, self.device, self.block_table,
                                  attention_backend=self.attention_backend)
