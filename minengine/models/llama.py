"""The Llama-family decoder over a flattened, paged batch.

One class covers Llama 2/3 (grouped-query attention, RoPE, RMSNorm, SwiGLU; Touvron et al. 2023), Qwen2
(the same with q/k/v biases) and Qwen3 (per-head RMSNorm on q and k). Parameter names equal the Hugging
Face checkpoints', so ``load_state_dict`` takes their tensors as they are.

Unlike transformers' padded [batch, seq] layout, every tensor here is [T, ...] for the T new tokens of a
step; each token carries its own position and the attention reads earlier tokens from the paged KV cache.

With a ``TensorParallelGroup`` of world size tp the model is one rank's shard (Megatron-LM, Shoeybi et al.
2019; ``layers/linear.py``): a tp-th of the query heads and of the MLP's intermediate features, its KV heads
(``distributed.kv_heads_of_rank``), a tp-th of the LM head's vocabulary; embeddings and norms replicated. A
layer runs two all-reduces (after o_proj and after down_proj), ``compute_logits`` one all-gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minengine.distributed import TensorParallelGroup, kv_heads_of_rank
from minengine.layers.attention import paged_attention, write_kv
from minengine.layers.linear import column_parallel_linear, lm_head, row_parallel_linear
from minengine.layers.norm import RMSNorm
from minengine.layers.rotary import RotaryEmbedding, apply_rotary
from minengine.worker.forward_batch import ForwardBatch


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class Attention(nn.Module):
    """Grouped-query attention over the paged KV cache; with tp ranks, this rank's heads: ``num_heads`` =
    query heads / tp, and ``num_kv_heads`` KV heads starting at ``first_kv_head`` (``kv_heads_of_rank``).
    ``k_scale`` / ``v_scale``: the per-tensor scales of an FP8 KV cache (``layers/kv_quant.py``; 1.0, vLLM's
    default; ``kv_quant.set_kv_scales`` sets calibrated ones; per tensor, so the same on every rank)."""

    def __init__(self, cfg, qkv_bias: bool, qk_norm: bool, tp: TensorParallelGroup):
        super().__init__()
        self.k_scale = self.v_scale = 1.0
        total_heads = cfg.num_attention_heads
        total_kv_heads = getattr(cfg, "num_key_value_heads", None) or total_heads
        self.num_heads = total_heads // tp.world_size
        self.first_kv_head, self.num_kv_heads = kv_heads_of_rank(total_kv_heads, tp.world_size, tp.rank)
        self.head_dim = d = _head_dim(cfg)
        self.scale = self.head_dim ** -0.5
        h = cfg.hidden_size
        kv_shard = (self.first_kv_head * d, self.num_kv_heads * d)
        self.q_proj = column_parallel_linear(h, total_heads * d, qkv_bias, tp)
        self.k_proj = column_parallel_linear(h, total_kv_heads * d, qkv_bias, tp, shard=kv_shard)
        self.v_proj = column_parallel_linear(h, total_kv_heads * d, qkv_bias, tp, shard=kv_shard)
        self.o_proj = row_parallel_linear(total_heads * d, h, getattr(cfg, "attention_bias", False), tp)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: ForwardBatch,
                kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; ``rope`` = the step's (cos, sin) [T, 1, D]; writes this step's K/V
        into ``kv_cache`` before reading it."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k_cache, v_cache = kv_cache
        write_kv(k, v, k_cache, v_cache, batch.slot_mapping, self.k_scale, self.v_scale)
        o = paged_attention(q, k, v, k_cache, v_cache, batch, self.scale, self.k_scale, self.v_scale)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer, 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg, tp: TensorParallelGroup):
        super().__init__()
        bias = getattr(cfg, "mlp_bias", False)
        self.gate_proj = column_parallel_linear(cfg.hidden_size, cfg.intermediate_size, bias, tp)
        self.up_proj = column_parallel_linear(cfg.hidden_size, cfg.intermediate_size, bias, tp)
        self.down_proj = row_parallel_linear(cfg.intermediate_size, cfg.hidden_size, bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.silu(self.gate_proj(x), inplace=True)  # in place: one [T, intermediate] buffer fewer
        return self.down_proj(gate.mul_(self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, qkv_bias: bool, qk_norm: bool, tp: TensorParallelGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, qkv_bias, qk_norm, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, x, rope, batch, kv_cache):
        x = x + self.self_attn(self.input_layernorm(x), rope, batch, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """``model.*`` in the checkpoint: embeddings (replicated on every rank), decoder layers, final norm."""

    def __init__(self, cfg, qkv_bias: bool, qk_norm: bool, tp: TensorParallelGroup):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, qkv_bias, qk_norm, tp) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama / Qwen2 / Qwen3 causal LM on a paged KV cache.

    Args:
        hf_config: the checkpoint's transformers config (``LlamaConfig``, ``Qwen2Config``, ``Qwen3Config``...).
        qkv_bias: q/k/v projections have biases (Qwen2).
        qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
        tp: this process's rank in a tensor-parallel group (the model is then its shard; the loader fills it
            with ``shard_weight`` slices of the checkpoint); None = world size 1, the whole model.
    """

    def __init__(self, hf_config, qkv_bias: bool = False, qk_norm: bool = False,
                 tp: TensorParallelGroup | None = None):
        super().__init__()
        self.config = hf_config
        self.tp = tp = tp or TensorParallelGroup()
        self.model = Backbone(hf_config, qkv_bias, qk_norm, tp)
        self.lm_head = lm_head(hf_config.hidden_size, hf_config.vocab_size, tp)
        self.rotary = RotaryEmbedding(hf_config)

    @property
    def num_kv_heads(self) -> int:
        return self.model.layers[0].self_attn.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.model.layers[0].self_attn.head_dim

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Run the step's T new tokens; returns the final hidden states [T, hidden] in the model dtype.

        ``kv_caches[l]`` is layer l's (k_cache, v_cache), each [num_blocks, block_size, Hkv, D].
        """
        x = self.model.embed_tokens(batch.input_ids)
        rope = self.rotary.cos_sin(batch.positions, x.dtype)  # once per step, shared by the layers
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x = layer(x, rope, batch, kv_cache)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] (only the sampling positions) -> logits [S, vocab] float32 (the whole vocabulary on
        every rank: one all-reduce with tp > 1)."""
        return self.lm_head(hidden).float()
