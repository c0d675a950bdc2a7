"""Mixture-of-experts checkpoints (Mixtral, Qwen3-MoE with a dense layer among its sparse ones): greedy outputs
token-identical to transformers' generate in float32 on CPU through chunked prefill, prefix-cache hits and
preemption, with the grouped expert path a step runs and with the reference layer."""

from __future__ import annotations

import pytest

from minengine import LLM, SamplingParams
from minengine.layers.moe import SparseMoeBlock
from minengine.models.moe import MoeForCausalLM, set_moe_implementation
from tests.conftest import generate_and_compare, hf_greedy

MAX_NEW = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
SHAPE = dict(max_model_len=1024)  # every engine of this file
ARCHS = ["random_mixtral", "random_qwen3_moe"]


def short_prompts(random_prompts: list[list[int]]) -> list[list[int]]:
    """Prompts of 1 to 257 tokens: around block boundaries and across many blocks."""
    return [p for p in random_prompts if len(p) <= 257]


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_matches_transformers(request, random_prompts, arch):
    """A 16-token budget: long prompts go in many chunks, mixed with other requests' decodes."""
    model = request.getfixturevalue(arch)
    llm = generate_and_compare(model, short_prompts(random_prompts), GREEDY, **SHAPE, max_num_batched_tokens=16,
                               max_num_seqs=4)
    net = llm.llm_engine.model
    assert isinstance(net, MoeForCausalLM) and any(isinstance(m, SparseMoeBlock) for m in net.modules())
    traces = llm.llm_engine.traces
    assert any(t.num_prefill_tokens and t.num_decode_tokens for t in traces)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_hits_match_transformers(request, random_prompts, arch):
    """Prompts sharing a 48-token prefix, run twice: the second pass reads every full cached block."""
    model = request.getfixturevalue(arch)
    base = random_prompts[-1]
    prompts = [base[:48] + base[100 + 20 * i:100 + 20 * i + 9 + i] for i in range(4)] + [base[:64]]
    llm = generate_and_compare(model, prompts, GREEDY, **SHAPE, max_num_batched_tokens=64, enable_prefix_caching=True)
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    for prompt, out in zip(prompts, again):
        assert out.outputs[0].token_ids == hf_greedy(model, tuple(prompt), MAX_NEW)
        assert out.num_cached_tokens == (len(prompt) - 1) // 16 * 16 > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_preemption_matches_transformers(request, random_prompts, arch):
    """A pool of 12 blocks for 6 prompts of up to 100 tokens: requests are preempted and recomputed."""
    model = request.getfixturevalue(arch)
    prompts = [p for p in random_prompts if 15 <= len(p) <= 100]
    llm = generate_and_compare(model, prompts, GREEDY, **SHAPE, max_num_batched_tokens=64, num_kv_blocks=12)
    assert llm.llm_engine.summary().num_preemptions > 0


def test_the_reference_layer_gives_the_same_tokens(random_qwen3_moe, random_prompts):
    llm = LLM(random_qwen3_moe, max_model_len=1024, max_num_batched_tokens=32)
    assert set_moe_implementation(llm.llm_engine.model, "reference") == 2  # layers 0 and 2; layer 1 is dense
    prompts = short_prompts(random_prompts)[::3]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(random_qwen3_moe, tuple(prompt), MAX_NEW)
