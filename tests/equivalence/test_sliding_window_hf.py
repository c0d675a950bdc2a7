"""Sliding-window models are token-identical to transformers in float32 on CPU with prompts and generations longer
than the window (chunked prefill, prefix hits, preemption), and a windowed model's requests hold a bounded
number of blocks however long they run (``core/windowed_kv_cache_manager.py``)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from minengine import LLM, SamplingParams
from minengine.core.windowed_kv_cache_manager import WindowedKVCacheManager, max_blocks_held
from minengine.models.windowed_llama import WindowedLlamaForCausalLM
from tests.conftest import _save_random_model, generate_and_compare, hf_greedy

WINDOW = 21  # not a multiple of the block size: the window starts inside a block
BLOCK_SIZE = 8
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
SHAPE = dict(max_model_len=1024, block_size=BLOCK_SIZE)  # every engine of this file
PROMPT_LENGTHS = (1, 20, 21, 22, 37, 64, 150)


@pytest.fixture(scope="module")
def windowed_mistral(tmp_path_factory) -> str:
    """A random-weight Mistral whose every layer has a window of ``WINDOW`` tokens."""
    from transformers import MistralConfig

    cfg = MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                        sliding_window=WINDOW, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    return _save_random_model(cfg, tmp_path_factory.mktemp("mistral-window"), seed=3)


@pytest.fixture(scope="module")
def interleaved_qwen2(tmp_path_factory) -> str:
    """A random-weight Qwen2 with a full-attention layer 0 and a windowed layer 1 (``max_window_layers=1``)."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=1024,
                      use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    assert cfg.layer_types == ["full_attention", "sliding_attention"]
    return _save_random_model(cfg, tmp_path_factory.mktemp("qwen2-window"), seed=4)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    stream = torch.randint(3, 512, (max(PROMPT_LENGTHS),), generator=g).tolist()
    # prefixes of one stream: the longer prompts hit the shorter ones' blocks in the prefix cache
    return [stream[:n] for n in PROMPT_LENGTHS]


CONFIGS = {
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=1024),
    "chunk-7": dict(long_prefill_token_threshold=7, max_num_batched_tokens=64),
    "chunk-16": dict(max_num_batched_tokens=16),
    "preemption": dict(max_num_batched_tokens=64, num_kv_blocks=22),
    # rejected proposals give back their blocks (``truncate``) behind released ones
    "spec": dict(max_num_batched_tokens=64, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                                "prompt_lookup_min": 1, "prompt_lookup_max": 2}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_windowed_mistral_matches_transformers(windowed_mistral, prompts, name):
    llm = generate_and_compare(windowed_mistral, prompts, GREEDY, **SHAPE, **CONFIGS[name])
    engine = llm.llm_engine
    assert isinstance(engine.model, WindowedLlamaForCausalLM)
    assert isinstance(engine.kv_cache_manager, WindowedKVCacheManager)
    summary = engine.summary()
    if name == "preemption":  # 22 blocks: the longest request alone (the engine checks that much), few more
        assert summary.num_preemptions > 0
    if name == "spec":
        assert summary.spec_draft_tokens > summary.spec_accepted_tokens > 0  # proposals accepted and rejected
    if name == "chunk-16":
        assert summary.prefix_hit_tokens > 0  # prefix hits on the shorter prompts' blocks


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_interleaved_full_and_windowed_layers_match_transformers(interleaved_qwen2, prompts, backend):
    """Layer 0 reads every key (on a CPU "auto" is the C++ kernel), layer 1 its window: two KV cache groups, the
    windowed one freed behind its window (``tests/equivalence/test_hybrid_kv_cache_hf.py`` tests them further)."""
    from minengine.core.hybrid_kv_cache_manager import HybridKVCacheManager

    llm = generate_and_compare(interleaved_qwen2, prompts, GREEDY, **SHAPE, max_num_batched_tokens=16,
                               attention_backend=backend)
    assert llm.llm_engine.model.layer_windows == [None, WINDOW]
    assert isinstance(llm.llm_engine.kv_cache_manager, HybridKVCacheManager)


def test_the_window_changes_the_tokens(windowed_mistral, prompts, tmp_path):
    """The same weights without the window give other tokens on a prompt longer than it, so the tests above
    check the window, not only the weights."""
    full = shutil.copytree(windowed_mistral, tmp_path / "full")
    config = json.loads((full / "config.json").read_text())
    config["sliding_window"] = None
    (full / "config.json").write_text(json.dumps(config))
    long_prompt = prompts[-1]
    llm = LLM(str(full), max_model_len=1024, block_size=BLOCK_SIZE)
    out = llm.generate([{"prompt_token_ids": long_prompt}], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert out == hf_greedy(str(full), tuple(long_prompt), MAX_NEW)
    assert out != hf_greedy(windowed_mistral, tuple(long_prompt), MAX_NEW)


def test_a_long_generation_holds_a_bounded_number_of_blocks(windowed_mistral, prompts):
    """One request, 200 tokens past a 37-token prompt in chunks of 16: after every step it holds at most
    ``max_blocks_held`` blocks (4 for a decode with window 21 and blocks of 8, reached whenever a token opens a
    block), its output is transformers', and at the end every block is free."""
    max_tokens, chunk = 200, 16
    llm = LLM(windowed_mistral, max_model_len=1024, block_size=BLOCK_SIZE, max_num_batched_tokens=chunk)
    engine = llm.llm_engine
    kv = engine.kv_cache_manager
    engine.add_request("long", {"prompt_token_ids": prompts[4]},
                       SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    held_in_decodes, output = [], None
    while engine.has_unfinished_requests():
        request = engine.scheduler.requests["long"]
        decoding = request.num_computed_tokens >= request.num_prompt_tokens
        for out in engine.step():
            output = out
        if engine.has_unfinished_requests():
            held = kv.num_held_blocks("long")
            assert held <= max_blocks_held(WINDOW, BLOCK_SIZE, 1 if decoding else chunk)
            assert held == kv.num_used_blocks  # the pool agrees: nothing else is held
            if decoding:
                held_in_decodes.append(held)
    assert max(held_in_decodes) == max_blocks_held(WINDOW, BLOCK_SIZE) == 4
    assert -(-(len(prompts[4]) + max_tokens) // BLOCK_SIZE) == 30  # what it would hold without the window
    assert output.outputs[0].token_ids == hf_greedy(windowed_mistral, tuple(prompts[4]), max_tokens)
    assert kv.num_free_blocks == engine.num_kv_blocks


@pytest.mark.parametrize("setting", [dict(preemption_mode="swap", swap_space=0.01),
                                     dict(async_scheduling=True)])
def test_settings_that_cannot_free_blocks_are_refused(windowed_mistral, setting):
    field = next(iter(setting))
    with pytest.raises(ValueError, match=f"{field}=.*not supported with sliding-window attention"):
        LLM(windowed_mistral, max_model_len=1024, **setting)


def test_the_triton_kernel_is_refused_before_any_step(interleaved_qwen2):
    with pytest.raises(ValueError, match="attention_backend='triton' takes no sliding window"):
        LLM(interleaved_qwen2, max_model_len=1024, attention_backend="triton")


def test_the_trace_shows_blocks_given_back_as_released(windowed_mistral, prompts):
    """A released block may belong to another request by the next step: the trace's block table writes -1 there
    (the runner's table keeps the old id), so no step shows a block in two tables unless its ref count says
    shared, and the dashboard's table draws the hole as "–"."""
    from minengine.viz.block_figures import RELEASED_ID, block_owners, block_tables_figure

    llm = LLM(windowed_mistral, max_model_len=1024, block_size=BLOCK_SIZE, max_num_batched_tokens=32,
              trace_block_tables=True, enable_prefix_caching=False)
    engine = llm.llm_engine
    for i, prompt in enumerate((prompts[4], prompts[5], prompts[6])):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    released = [tr for tr in engine.traces if any(RELEASED_ID in table for table in tr.block_tables.values())]
    assert released, "no step showed a released block"
    for tr in engine.traces:
        for block, holders in block_owners(tr).items():
            assert len(holders) == 1 or tr.block_ref_counts[block] == len(holders), (tr.step, block, holders)
        for rid, table in tr.block_tables.items():
            live = [b for b in table if b != RELEASED_ID]
            assert table == [RELEASED_ID] * (len(table) - len(live)) + live  # holes only at the front
            assert all(tr.block_ref_counts[b] >= 1 for b in live), (tr.step, rid, table)
    cells = block_tables_figure(released[-1]).data[0].text
    assert any("–" in row for row in cells)
