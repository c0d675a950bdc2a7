"""Greedy outputs are token-identical to transformers' generate in float32 on CPU, whatever the chunk size,
batch mix, prefix-cache state, preemption or sequence slots."""

from __future__ import annotations

import pytest

from minengine import LLM, SamplingParams
from tests.conftest import hf_greedy

MAX_NEW = 16
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)

# name -> engine settings (max_model_len 2048 keeps the no-chunking budget small)
CONFIGS = {
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=2048),
    "chunk-1": dict(long_prefill_token_threshold=1, max_num_batched_tokens=64),
    "chunk-7": dict(long_prefill_token_threshold=7, max_num_batched_tokens=64),
    "chunk-16": dict(max_num_batched_tokens=16),
    "chunk-64": dict(max_num_batched_tokens=64),
    "chunk-256": dict(max_num_batched_tokens=256),
    "preemption": dict(max_num_batched_tokens=256, num_kv_blocks=80),
    "seqs-1": dict(max_num_seqs=1, max_num_batched_tokens=512),
    "seqs-3": dict(max_num_seqs=3, max_num_batched_tokens=128),
    "seqs-64": dict(max_num_seqs=64, max_num_batched_tokens=4096),
}


def run_and_compare(model: str, prompts: list[list[int]], **config):
    llm = LLM(model, max_model_len=2048, **config)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(model, tuple(prompt), MAX_NEW), f"prompt of {len(prompt)} tokens"
    kv = llm.llm_engine.kv_cache_manager
    assert kv.num_free_blocks == llm.llm_engine.num_kv_blocks  # every block is free again
    return llm


# One-token prefill chunks make a step per prompt token: those configs take the prompts up to this length (every
# block-boundary case of tests/prompts.py up to 8 blocks + 1); the long prompts run in every other config.
ONE_TOKEN_CHUNK_MAX_PROMPT = 129


def prompts_for(name: str, prompts: list[list[int]]) -> list[list[int]]:
    """The prompts config ``name`` runs: all of them, or the short ones where prefill chunks are one token."""
    if CONFIGS[name].get("long_prefill_token_threshold") == 1:
        return [p for p in prompts if len(p) <= ONE_TOKEN_CHUNK_MAX_PROMPT]
    return prompts


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bundled_model_matches_transformers(bundled_model, bundled_prompts, name):
    assert len(bundled_prompts) >= 20 and min(map(len, bundled_prompts)) == 1 and max(map(len, bundled_prompts)) > 1000
    prompts = prompts_for(name, bundled_prompts)
    assert max(map(len, prompts)) > 8 * 16  # still crosses several blocks
    llm = run_and_compare(bundled_model, prompts, **CONFIGS[name])
    summary = llm.llm_engine.summary()
    if name == "preemption":
        assert summary.num_preemptions > 0
    if name.startswith("chunk-") and name != "chunk-256":
        # some step really mixed a prefill chunk with decodes
        assert any(t.num_prefill_tokens and t.num_decode_tokens for t in llm.llm_engine.traces)


@pytest.mark.parametrize("name", ["chunk-1", "chunk-16", "preemption", "seqs-64"])
def test_bundled_model_matches_transformers_on_the_torch_attention_path(bundled_model, bundled_prompts, name,
                                                                       monkeypatch):
    """The tests above take minengine's C++ CPU attention kernel where it builds; the torch path (gather + SDPA,
    what runs without a compiler or with MINENGINE_CPU_KERNEL=0) must give the same tokens."""
    monkeypatch.setenv("MINENGINE_CPU_KERNEL", "0")
    run_and_compare(bundled_model, prompts_for(name, bundled_prompts), **CONFIGS[name])


@pytest.mark.parametrize("name", ["no-chunking", "chunk-7", "preemption", "seqs-3"])
@pytest.mark.parametrize("arch", ["random_llama", "random_qwen2"])
def test_random_models_match_transformers(request, random_prompts, arch, name):
    model = request.getfixturevalue(arch)
    run_and_compare(model, random_prompts, **CONFIGS[name])


def test_prefix_caching_matches_transformers(bundled_model, bundled_prompts):
    """Shared prefixes, a prompt that is an exact multiple of block_size, a full-prefix hit, and hits on
    blocks cached earlier in the same step; outputs stay identical and the cache really hits."""
    base = bundled_prompts[-1]  # 1100 tokens
    system = base[:96]  # 6 full blocks shared by everybody
    prompts = [
        system + base[200:230],  # shared prefix, different tails
        system + base[300:317],
        system + base[400:401],
        base[:64],  # exact multiple of block_size (4 blocks)
        base[:64],  # the same again: full-prefix hit (3 blocks cached, the last recomputed)
        base[:160],  # extends the 64-token prompt
        system,  # the shared prefix alone (a multiple of 16)
    ]
    llm = LLM(bundled_model, max_model_len=2048, max_num_batched_tokens=128, enable_prefix_caching=True)
    engine = llm.llm_engine
    first = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    hits_first = engine.summary().prefix_hit_tokens
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)  # warm cache
    for prompt, a, b in zip(prompts, first, again):
        ref = hf_greedy(bundled_model, tuple(prompt), MAX_NEW)
        assert a.outputs[0].token_ids == ref and b.outputs[0].token_ids == ref
    assert hits_first > 0
    # Second pass: every prompt hits all its full blocks except the one holding its last token.
    for prompt, b in zip(prompts, again):
        assert b.num_cached_tokens == (len(prompt) - 1) // 16 * 16
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_prefix_cache_survives_preemption(bundled_model, bundled_prompts):
    prompts = [bundled_prompts[-1][:300] + p[:20] for p in bundled_prompts[:10]]
    llm = run_and_compare(bundled_model, prompts, max_num_batched_tokens=128, num_kv_blocks=40)
    summary = llm.llm_engine.summary()
    assert summary.num_preemptions > 0 and summary.prefix_hit_tokens > 0
