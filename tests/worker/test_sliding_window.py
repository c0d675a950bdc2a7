"""Sliding-window attention in the worker: which layers a config windows (as the installed transformers reads it),
the paged read through a window-cut batch against a dense windowed reference, the loader's model class, and the
clear errors (a Triton batch, a malformed window)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from minengine.layers.attention import paged_attention, write_kv
from minengine.layers.sliding_window import windowed_batch
from minengine.models.layer_windows import hybrid_window, kv_window, layer_windows
from minengine.models.llama import LlamaForCausalLM
from minengine.models.loader import load_model, model_class
from minengine.models.windowed_llama import WindowedLlamaForCausalLM
from minengine.worker.forward_batch import ForwardBatch
from tests.worker.test_attention_paths import BS, POISON, make_step


def test_which_layers_each_config_windows():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    small = dict(num_hidden_layers=4, hidden_size=32, num_attention_heads=2, intermediate_size=64)
    assert layer_windows(MistralConfig(sliding_window=64, **small)) == [64] * 4
    assert layer_windows(MistralConfig(sliding_window=None, **small)) == [None] * 4
    assert layer_windows(Qwen2Config(use_sliding_window=True, sliding_window=32, max_window_layers=2, **small)) \
        == [None, None, 32, 32]
    assert layer_windows(Qwen2Config(use_sliding_window=False, sliding_window=32, **small)) == [None] * 4
    assert layer_windows(Qwen3Config(use_sliding_window=True, sliding_window=16, max_window_layers=0, **small)) \
        == [16] * 4
    assert layer_windows(LlamaConfig(**small)) == [None] * 4
    assert kv_window(MistralConfig(sliding_window=64, **small)) == 64
    # one full-attention layer reads every key: no block of a table shared by every layer can be freed; the
    # mixed model gets two KV cache groups instead, the windowed one freed by its window
    mixed = Qwen2Config(use_sliding_window=True, sliding_window=32, max_window_layers=2, **small)
    assert kv_window(mixed) is None and hybrid_window(mixed) == 32
    assert hybrid_window(MistralConfig(sliding_window=64, **small)) is None  # every layer windowed: one group
    assert hybrid_window(LlamaConfig(**small)) is None
    assert model_class(MistralConfig(sliding_window=64, **small)) is WindowedLlamaForCausalLM
    assert model_class(Qwen2Config(use_sliding_window=False, **small)) is LlamaForCausalLM


def test_malformed_windows_are_refused_naming_the_field():
    from transformers import MistralConfig, Qwen2Config

    small = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64)
    bad = MistralConfig(**small)
    bad.sliding_window = 0
    with pytest.raises(ValueError, match="sliding_window"):
        layer_windows(bad)
    bad = Qwen2Config(use_sliding_window=True, sliding_window=8, **small)
    bad.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(ValueError, match="layer_types"):
        layer_windows(bad)


def dense_windowed(step, q, k_cache, v_cache, batch, scale, window):
    """Per request: every key slot by slot, query position p seeing keys p - window < k <= p, softmax in float64."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    qsl = batch.query_start_loc.tolist()
    group = q.shape[1] // k_cache.shape[2]
    for j, i in enumerate(batch.batch_order.tolist()):
        s = step.scheduled[i]
        slots = [(s.block_ids[p // BS], p % BS) for p in range(s.seq_len)]
        k = torch.stack([k_cache[x, y] for x, y in slots]).double().repeat_interleave(group, 1)
        v = torch.stack([v_cache[x, y] for x, y in slots]).double().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[qsl[j]:qsl[j + 1]].double(), k) * scale
        q_pos, k_pos = torch.arange(s.start_pos, s.seq_len)[:, None], torch.arange(s.seq_len)[None, :]
        scores = scores.masked_fill((k_pos > q_pos) | (k_pos <= q_pos - window), float("-inf"))
        out[qsl[j]:qsl[j + 1]] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


# (tokens cached, new tokens): decodes and chunks, from position 0 and after context, shorter and longer than windows
STEP = [(0, 6), (9, 1), (5, 3), (0, 1), (17, 1), (0, 13), (5, 3), (2, 1), (30, 1), (8, 4), (21, 7)]


@pytest.mark.parametrize("window", [1, 3, 5, 8, 100])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_the_windowed_read_matches_a_dense_windowed_reference(window, backend):
    heads, kv_heads, head_dim = 4, 2, 8
    step, k_cache, v_cache, gen = make_step(STEP, kv_heads, head_dim, seed=window)
    for s in step.scheduled:  # the keys no query reads may be anything, even freed and reused: poison them
        for p in range(max(0, s.start_pos - window + 1)):
            k_cache[s.block_ids[p // BS], p % BS] = POISON
            v_cache[s.block_ids[p // BS], p % BS] = POISON
    batch = ForwardBatch.build(step, BS, "cpu", attention_backend=backend)
    t = batch.num_tokens
    q = torch.randn(t, heads, head_dim, generator=gen)
    k_new = torch.randn(t, kv_heads, head_dim, generator=gen)
    v_new = torch.randn(t, kv_heads, head_dim, generator=gen)
    write_kv(k_new, v_new, k_cache, v_cache, batch.slot_mapping)
    windowed = windowed_batch(batch, window)
    out = paged_attention(q, k_new, v_new, k_cache, v_cache, windowed, head_dim ** -0.5)
    # a decode gathers the blocks its window covers, not its whole table (the longest decode here has 31 keys)
    assert max(g.num_blocks for g in windowed.decode_groups) == min(1 + -(-(window - 1) // BS), -(-31 // BS))
    for g in windowed.prefill_groups:  # a chunk gathers from the block its first query's window starts in
        first = max(0, g.seq_len - g.q_len - window + 1) // BS if g.seq_len > window else 0
        assert g.block_ids.numel() == g.num_requests * (-(-g.seq_len // BS) - first)
    ref = dense_windowed(step, q, k_cache, v_cache, batch, head_dim ** -0.5, window)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert batch.attention_backend == backend  # the step's own batch is left as it was


def test_a_triton_batch_is_refused_with_the_backend_to_use():
    step, *_ = make_step([(3, 1), (0, 4)], 2, 8, seed=0)
    batch = ForwardBatch.build(step, BS, "cpu", attention_backend="triton")
    with pytest.raises(ValueError, match="attention_backend='reference'"):
        windowed_batch(batch, 4)


def test_the_loader_builds_the_windowed_model_and_refuses_a_malformed_window(random_llama, tmp_path):
    from transformers import MistralConfig

    windowed = tmp_path / "mistral"
    shutil.copytree(random_llama, windowed)  # Llama's weights are a Mistral's (same names and shapes)
    cfg = json.loads((windowed / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=12)
    (windowed / "config.json").write_text(json.dumps(cfg))
    net, hf_config, _ = load_model(str(windowed))
    assert isinstance(hf_config, MistralConfig) and isinstance(net, WindowedLlamaForCausalLM)
    assert net.layer_windows == [12] * hf_config.num_hidden_layers
    cfg["sliding_window"] = -1
    (windowed / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="sliding_window"):
        load_model(str(windowed))
