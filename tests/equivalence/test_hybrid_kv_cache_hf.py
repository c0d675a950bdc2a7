"""Models that mix full-attention and sliding-window layers run with two KV cache groups
(``core/hybrid_kv_cache_manager.py``): token-identical to transformers in float32 on CPU with prompts and
generations longer than the window (chunked prefill, prefix hits, preemption, mixed batches), the windowed
group's blocks held per request bounded by the window while the full group's grow, every block free at the
end."""

from __future__ import annotations

import pytest
import torch

from minengine import LLM, SamplingParams
from minengine.core.hybrid_kv_cache_manager import HybridKVCacheManager
from minengine.core.kv_cache_manager import cdiv
from minengine.core.windowed_kv_cache_manager import max_blocks_held
from minengine.worker.hybrid_model_runner import HybridModelRunner
from tests.conftest import _save_random_model, generate_and_compare, hf_greedy

WINDOW = 21  # not a multiple of the block size: the window starts inside a block
BLOCK_SIZE = 8
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
SHAPE = dict(max_model_len=1024, block_size=BLOCK_SIZE)  # every engine of this file (prefix caching on)
PROMPT_LENGTHS = (1, 20, 21, 22, 37, 64, 150)
QWEN = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, use_sliding_window=True, sliding_window=WINDOW,
            max_window_layers=2, bos_token_id=1, eos_token_id=2)
LAYER_TYPES = ["full_attention", "full_attention", "sliding_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def mixed_qwen2(tmp_path_factory) -> str:
    """A random-weight Qwen2: layers 0-1 full attention, layers 2-3 a window of ``WINDOW`` tokens."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(**QWEN, tie_word_embeddings=True)
    assert cfg.layer_types == LAYER_TYPES
    return _save_random_model(cfg, tmp_path_factory.mktemp("qwen2-mixed"), seed=6)


@pytest.fixture(scope="module")
def mixed_qwen3(tmp_path_factory) -> str:
    """The same layout as a Qwen3 (q/k norms, no q/k/v biases)."""
    from transformers import Qwen3Config

    cfg = Qwen3Config(**QWEN, head_dim=16, tie_word_embeddings=False)
    assert cfg.layer_types == LAYER_TYPES
    return _save_random_model(cfg, tmp_path_factory.mktemp("qwen3-mixed"), seed=7)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(8)
    stream = torch.randint(3, 512, (max(PROMPT_LENGTHS),), generator=g).tolist()
    # prefixes of one stream: the longer prompts hit the shorter ones' blocks in the prefix cache
    return [stream[:n] for n in PROMPT_LENGTHS]


CONFIGS = {
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=1024),
    "no-prefix-caching": dict(enable_prefix_caching=False, max_num_batched_tokens=16),
    "chunk-7": dict(long_prefill_token_threshold=7, max_num_batched_tokens=64),
    "chunk-16": dict(max_num_batched_tokens=16),
    "preemption": dict(max_num_batched_tokens=64, num_kv_blocks=22),  # the longest request alone, few more
    "spec": dict(max_num_batched_tokens=64, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                                "prompt_lookup_min": 1, "prompt_lookup_max": 2}),
}


def _check_two_groups(llm: LLM) -> HybridKVCacheManager:
    engine = llm.llm_engine
    assert engine.model.layer_windows == [None, None, WINDOW, WINDOW]
    assert isinstance(engine.runner, HybridModelRunner)
    kv = engine.kv_cache_manager
    assert isinstance(kv, HybridKVCacheManager)
    assert kv.pool.num_free_blocks == kv.windowed.num_free_blocks == engine.num_kv_blocks  # both groups free
    return kv


@pytest.mark.parametrize("name", list(CONFIGS))
def test_mixed_qwen2_matches_transformers(mixed_qwen2, prompts, name):
    """All seven prompts in one ``generate``: the steps mix prefill chunks and decodes of several requests."""
    llm = generate_and_compare(mixed_qwen2, prompts, GREEDY, **SHAPE, **CONFIGS[name])
    _check_two_groups(llm)
    summary = llm.llm_engine.summary()
    if name == "preemption":
        assert summary.num_preemptions > 0
    if name == "spec":
        assert summary.spec_draft_tokens > summary.spec_accepted_tokens > 0  # proposals accepted and rejected
    if name == "chunk-16":
        assert summary.prefix_hit_tokens > 0  # prefix hits on the shorter prompts' blocks, in both groups


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_mixed_qwen3_matches_transformers(mixed_qwen3, prompts, backend):
    """On a CPU "auto" runs the full-attention layers on the C++ kernel, the windowed ones on the reference."""
    llm = generate_and_compare(mixed_qwen3, prompts, GREEDY, **SHAPE, max_num_batched_tokens=16,
                               attention_backend=backend)
    _check_two_groups(llm)


def test_a_long_generation_holds_a_bounded_windowed_group(mixed_qwen2, prompts):
    """Two requests, 200 tokens each past prompts of 37 and 64 tokens, in steps of at most 16 tokens: after every
    step each one's windowed group holds at most ``max_blocks_held`` blocks while its full group holds every
    block of its tokens, the pools agree, the outputs are transformers', and at the end every block is free."""
    max_tokens, chunk = 200, 16
    llm = LLM(mixed_qwen2, **SHAPE, max_num_batched_tokens=chunk, trace_block_tables=True)
    engine = llm.llm_engine
    kv = engine.kv_cache_manager
    ids = {"a": prompts[4], "b": prompts[5]}
    for rid, prompt in ids.items():
        engine.add_request(rid, {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    outputs, full_held, windowed_in_decodes = {}, [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
        running = engine.scheduler.running
        for request in running:
            full, windowed = kv.num_held_blocks(request.request_id)
            assert full == cdiv(request.num_computed_tokens, BLOCK_SIZE)
            assert windowed <= max_blocks_held(WINDOW, BLOCK_SIZE, chunk)
            if request.num_computed_tokens > request.num_prompt_tokens:  # decoding
                assert windowed <= max_blocks_held(WINDOW, BLOCK_SIZE)
                windowed_in_decodes.append(windowed)
            full_held.append(full)
        # the pools agree: their used blocks are the ones the tables hold (the second prompt's first 37 tokens
        # are the first's: its prefix hit shares their full blocks)
        for group in (kv.full, kv.windowed):
            held = {b.block_id for r in running for b in group.req_to_blocks.get(r.request_id, ()) if b.block_id >= 0}
            assert group.num_used_blocks == len(held)
    assert max(windowed_in_decodes) == max_blocks_held(WINDOW, BLOCK_SIZE) == 4
    assert max(full_held) == cdiv(64 + max_tokens - 1, BLOCK_SIZE) == 33  # the last token's K/V is never written
    for rid, prompt in ids.items():
        assert outputs[rid].outputs[0].token_ids == hf_greedy(mixed_qwen2, tuple(prompt), max_tokens)
    assert engine.summary().prefix_hit_tokens > 0
    _check_two_groups(llm)
    # the trace shows both groups' tables: the windowed one with released blocks (-1) at its front
    last = next(tr for tr in reversed(engine.traces) if tr.windowed_block_tables)
    rid, windowed_table = next(iter(last.windowed_block_tables.items()))
    assert len(windowed_table) == len(last.block_tables[rid]) and windowed_table[0] == -1
    assert -1 not in last.block_tables[rid]


@pytest.mark.parametrize("setting, field", [
    (dict(preemption_mode="swap", swap_space=0.01), "preemption_mode"),
    (dict(async_scheduling=True), "async_scheduling"),
    (dict(tensor_parallel_size=2, allow_cpu_oversubscription=True), "tensor_parallel_size"),
    (dict(distributed_executor_backend="mp"), "distributed_executor_backend"),
])
def test_settings_two_groups_do_not_support_are_refused(mixed_qwen2, setting, field):
    with pytest.raises(ValueError, match=f"{field}=.*not supported"):
        LLM(mixed_qwen2, max_model_len=1024, **setting)
