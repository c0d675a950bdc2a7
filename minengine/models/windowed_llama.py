"""The Llama-family decoder with sliding-window layers (Mistral, Qwen2/Qwen3 with ``use_sliding_window``).

The loader builds this class instead of ``LlamaForCausalLM`` when a config windows any layer
(``models/layer_windows.py``); the weights, the layers and every full-attention layer are ``LlamaForCausalLM``'s.
Only ``forward`` differs: each windowed layer gets the step's ``ForwardBatch`` with its masks cut to the layer's
window (``layers/sliding_window.windowed_batch``, built once per step and window). A model that mixes full and
windowed layers has two KV cache groups (``core/hybrid_kv_cache_manager.py``): its runner hands a
``HybridForwardBatch``, and the windowed layers read, and write their K/V through, the windowed group's batch.
"""

from __future__ import annotations

import torch

from minengine.distributed import TensorParallelGroup
from minengine.layers.sliding_window import windowed_batch
from minengine.models.layer_windows import layer_windows
from minengine.models.llama import LlamaForCausalLM
from minengine.worker.forward_batch import ForwardBatch
from minengine.worker.hybrid_model_runner import HybridForwardBatch


class WindowedLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` whose layers attend within their windows (arguments as ``LlamaForCausalLM``'s).

    Attributes:
        layer_windows: each layer's window in tokens, None for a full-attention layer.
    """

    def __init__(self, hf_config, qkv_bias: bool = False, qk_norm: bool = False,
                 tp: TensorParallelGroup | None = None):
        super().__init__(hf_config, qkv_bias, qk_norm, tp)
        self.layer_windows = layer_windows(hf_config)

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """As ``LlamaForCausalLM.forward``; a windowed layer reads through its window's batch.

        Raises:
            ValueError: a batch built for the Triton kernel (``windowed_batch``).
        """
        # two KV cache groups (worker/hybrid_model_runner.py): the windowed layers read their own group's tables
        window_source = batch.windowed_group if isinstance(batch, HybridForwardBatch) else batch
        batches = {window: windowed_batch(window_source, window) for window in set(self.layer_windows) - {None}}
        batches[None] = batch
        x = self.model.embed_tokens(batch.input_ids)
        rope = self.rotary.cos_sin(batch.positions, x.dtype)
        for layer, kv_cache, window in zip(self.model.layers, kv_caches, self.layer_windows):
            x = layer(x, rope, batches[window], kv_cache)
        return self.model.norm(x)

