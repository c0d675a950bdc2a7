"""Layers: the fused RMSNorm and the per-step RoPE equal transformers' formulas bit for bit."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from minengine.layers.norm import RMSNorm
from minengine.layers.rotary import RotaryEmbedding, apply_rotary, rotate_half


def test_rms_norm_is_bitwise_transformers_formula():
    torch.manual_seed(0)
    for shape in [(1000, 256), (64, 384), (7, 3, 32)]:
        norm = RMSNorm(shape[-1], eps=1e-5)
        with torch.no_grad():
            norm.weight.normal_()
        x = torch.randn(*shape) * 3
        ref = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))  # LlamaRMSNorm in fp32
        assert torch.equal(norm(x), ref)
        bf = norm.to(torch.bfloat16)
        xb = x.bfloat16()
        xf = xb.float()
        ref_b = bf.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
        assert torch.equal(bf(xb), ref_b)
        norm.float()


def test_rope_once_per_step_equals_per_layer():
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    rope = RotaryEmbedding(cfg)
    positions = torch.tensor([0, 5, 17, 3, 1000])
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    cos, sin = rope.cos_sin(positions, torch.float32)
    rq, rk = rope(positions, q, k)
    assert torch.equal(apply_rotary(q, cos, sin), rq) and torch.equal(apply_rotary(k, cos, sin), rk)
    assert torch.equal(rq, q * cos + rotate_half(q) * sin)


def test_llama3_rope_builds_under_the_meta_device():
    """The loader builds the model under ``torch.device("meta")``; Llama 3's scaled RoPE must still init."""
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=16384,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})
    with torch.device("meta"):
        rope = RotaryEmbedding(cfg)
    assert rope.inv_freq.shape == (8,)
    ref = RotaryEmbedding(cfg)
    assert torch.equal(ref.inv_freq, RotaryEmbedding(cfg).inv_freq) and ref.inv_freq.device.type == "cpu"
