"""Rotary position embedding (RoPE, Su et al., 2021), in the rotate-half layout of Llama checkpoints."""

from __future__ import annotations

import torch
from torch import nn


def rope_inv_freq(hf_config) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim // 2] (float32) and the cos/sin scaling factor for a model config.

    Plain RoPE is computed here; scaled variants of real checkpoints (Llama 3's "llama3", "linear", "yarn",
    "longrope") reuse transformers' own initialisers so the numbers are the checkpoint's. Position-dependent
    "dynamic" scaling is not supported.

    Raises:
        ValueError: for "dynamic" or an unknown rope type.
    """
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    if rope_type == "default":
        base = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        # On the CPU also under ``torch.device("meta")``: a meta arange goes through ``torch._refs``, whose
        # first call imports ``torch._dynamo`` (seconds of a process's start)
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu") / head_dim))
        return inv_freq, 1.0
    if rope_type == "dynamic":
        raise ValueError("rope_type 'dynamic' (position-dependent NTK scaling) is not supported by minengine")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unknown rope_type {rope_type!r}")
    # On CPU even when the model is being built under ``torch.device("meta")`` (the loader does): the
    # initialisers compute with real numbers and would fail on meta tensors.
    with torch.device("cpu"):
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by cos/sin [T, 1, D]: ``x * cos + rotate_half(x) * sin`` (transformers' formula)."""
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their token positions.

    ``cos_sin(positions, dtype)`` is computed once per step and shared by every layer (``apply_rotary``);
    ``forward(positions, q, k)`` does both at once. positions [T] int64, q [T, Hq, D], k [T, Hkv, D] ->
    rotated (q, k), same shapes and dtypes. Each token carries its own position, so a flattened batch of
    chunks and decodes needs no padding.
    """

    def __init__(self, hf_config):
        super().__init__()
        inv_freq, self.scaling = rope_inv_freq(hf_config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, D] in ``dtype`` for positions [T] (angles computed in float32)."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype)[:, None, :], (emb.sin() * self.scaling).to(dtype)[:, None, :]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(positions, q.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
