"""Expert parallelism on the CPU: a MoE model over 2 worker processes (gloo), experts split, tokens by all-to-all.

Random-weight Mixtral (4 experts, top-2) and Qwen3-MoE (8 experts, top-2, a dense middle layer) with
``tensor_parallel_size=2, enable_expert_parallel=True``: greedy tokens equal one process's through chunked prefill,
prefix-cache hits and preemptions (a float32 all-reduce adds in another order: a token may differ only at a
near-tie, ``test_tensor_parallel.assert_same_greedy``). Every step, every rank's all-to-all bytes equal
``timing.expert_parallel.traffic_of_step`` of the routing the ranks report, and the routed pairs are the step's
tokens times top-k. Bad combinations are ValueErrors naming ``enable_expert_parallel`` before any process starts.
"""

from __future__ import annotations

import pytest

from minengine import LLM, SamplingParams
from minengine.models.moe import moe_settings
from minengine.timing import traffic_of_step
from minengine.timing.cost_model import StepWork
from tests.engine.test_tensor_parallel import WORKLOAD, assert_same_greedy, children, generate, workload_prompts

EP2 = dict(tensor_parallel_size=2, enable_expert_parallel=True, **WORKLOAD)


@pytest.fixture(scope="module")
def stream() -> list[int]:
    import torch

    return torch.randint(3, 512, (800,), generator=torch.Generator().manual_seed(1)).tolist()


def check_collectives_of_each_step(llm: LLM) -> None:
    """Two requests stepped one step at a time: every rank's all-to-all bytes equal ``traffic_of_step`` of the
    loads all ranks routed (per MoE layer), the loads add up to the step's tokens x top-k, and the all-gathers
    are one per MoE layer (plus the LM head's when a row samples)."""
    engine = llm.llm_engine
    cfg = engine.hf_config
    moe = moe_settings(cfg)
    sparse, hidden = len(moe.sparse_layers), cfg.hidden_size
    engine.add_request("long", {"prompt_token_ids": list(range(3, 150))}, SamplingParams(max_tokens=3))
    engine.add_request("short", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4))
    while engine.has_unfinished_requests():
        engine.step()
        trace, replies = engine.traces[-1], engine.runner.last_replies
        tokens = StepWork.from_step_trace(trace).num_tokens
        traffic = traffic_of_step([reply.expert_loads for reply in replies], tokens, hidden, 4)
        for layer in range(sparse):
            assert sum(reply.expert_loads[layer][e] for reply in replies for e in range(moe.num_experts)) \
                == tokens * moe.top_k
        rows = sum(c.sampled for c in trace.chunks)
        for rank, reply in enumerate(replies):
            assert len(reply.expert_loads) == sparse
            assert reply.num_all_to_alls == 3 * sparse  # counts, dispatch, combine
            assert reply.all_to_all_bytes == traffic[rank].all_to_all_bytes, f"step {trace.step}"
            gathered = traffic[rank].gather_bytes + rows * cfg.vocab_size * 4
            assert (reply.num_all_gathers, reply.all_gather_bytes) == (sparse + (rows > 0), gathered)
            # attention's o_proj in every layer, and a dense layer's down_proj (tensor-parallel as before)
            assert reply.num_all_reduces == 2 * cfg.num_hidden_layers - sparse


@pytest.mark.parametrize("fixture", ["random_mixtral", "random_qwen3_moe"])
def test_expert_parallel_over_two_ranks_matches_one_process_and_the_count(fixture, stream, request):
    model = request.getfixturevalue(fixture)
    prompts = workload_prompts(stream)
    ref = generate(LLM(model, **WORKLOAD), prompts)
    before = children()
    llm = LLM(model, **EP2)
    engine = llm.llm_engine
    try:
        assert len(children() - before) == 2 and engine.model is None
        got = generate(llm, prompts)
        for prompt, g, r in zip(prompts, got, ref):
            assert_same_greedy(model, prompt, g, r, "EP 2 vs one process")
        assert engine.summary().num_preemptions > 0
        assert any(t.prefix_hit_tokens for t in engine.traces)
        assert any(t.num_prefill_tokens and t.num_decode_tokens for t in engine.traces)
        assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
        check_collectives_of_each_step(llm)
    finally:
        engine.shutdown()
    assert children() - before == set()


def test_bad_expert_parallel_combinations_are_value_errors_before_any_process(random_mixtral, random_qwen3_moe,
                                                                             bundled_model):
    before = children()
    with pytest.raises(ValueError, match="enable_expert_parallel=True needs a mixture-of-experts model; llama"):
        LLM(bundled_model, tensor_parallel_size=2, enable_expert_parallel=True)
    with pytest.raises(ValueError, match="enable_expert_parallel=True needs a mixture-of-experts model"):
        LLM(bundled_model, enable_expert_parallel=True)  # one process: still a misconfiguration
    with pytest.raises(ValueError, match="tensor_parallel_size=2 on a mixtral model needs enable_expert_parallel"):
        LLM(random_mixtral, tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"8 experts must divide by tensor_parallel_size \(3\)"):
        LLM(random_qwen3_moe, tensor_parallel_size=3, enable_expert_parallel=True, allow_cpu_oversubscription=True)
    with pytest.raises(ValueError, match="enable_expert_parallel must be a bool"):
        LLM(random_mixtral, enable_expert_parallel="yes")
    assert children() == before


def test_one_process_with_expert_parallel_is_the_plain_model(random_mixtral, stream):
    """At ``tensor_parallel_size=1`` the switch changes nothing (vLLM's): the same tokens as without it."""
    prompts = workload_prompts(stream)[:3]
    assert generate(LLM(random_mixtral, enable_expert_parallel=True, **WORKLOAD), prompts) == \
        generate(LLM(random_mixtral, **WORKLOAD), prompts)


def test_enable_expert_parallel_on_every_entry_point(monkeypatch):
    """``EngineArgs`` and ``minengine serve / run / generate --enable-expert-parallel``, beside the TP flag."""
    import minengine.__main__ as cli
    from minengine import EngineArgs

    assert EngineArgs(tensor_parallel_size=2, enable_expert_parallel=True).create_engine_config() \
        .enable_expert_parallel
    configs = []
    for command in ("serve", "run", "generate"):
        monkeypatch.setattr(cli, f"cmd_{command}", lambda a: configs.append(cli._config(a)))
    for command in (["serve"], ["run"], ["generate", "ROMEO:"]):
        cli.main([*command, "--tensor-parallel-size", "2", "--enable-expert-parallel"])
    assert [(c.tensor_parallel_size, c.enable_expert_parallel) for c in configs] == [(2, True)] * 3
