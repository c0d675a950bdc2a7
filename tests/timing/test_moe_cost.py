"""The modelled clock on mixtures of experts: parameter counts (total and active) against transformers, the experts a
step hits (expected and exact), the busiest rank under expert parallelism, the all-to-all's bytes, and a published
Mixtral-8x7B measurement the model is compared with."""

from __future__ import annotations

import random

import pytest

from minengine.timing import StepCostModel, StepWork
from minengine.timing.clocks import shape_for_engine
from minengine.timing.model_shape import LLAMA_3_8B, MIXTRAL_8X7B, QWEN3_30B_A3B, ModelShape, get_model_shape
from minengine.timing.moe_cost import alltoall_bytes, alltoall_time

TINY_MOE = ModelShape("tiny moe", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
                      intermediate_size=16, vocab_size=10, num_experts=4, top_k=2, expert_intermediate_size=6)


def _qwen3_moe_config(**changes):
    from transformers import Qwen3MoeConfig

    fields = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                  num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                  num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False)
    return Qwen3MoeConfig(**{**fields, **changes})


def test_published_moe_shapes_total_and_active_parameters():
    # Mistral AI's Mixtral paper: 46.7 B parameters, 12.9 B active per token; Qwen3's model card: 30.5 B, 3.3 B
    assert round(MIXTRAL_8X7B.num_params / 1e9, 1) == 46.7 and round(MIXTRAL_8X7B.num_active_params / 1e9, 1) == 12.9
    assert round(QWEN3_30B_A3B.num_params / 1e9, 1) == 30.5
    assert round(QWEN3_30B_A3B.num_active_params / 1e9, 1) == 3.4  # 3.35 B: the model card rounds it down to 3.3
    assert LLAMA_3_8B.num_active_params == LLAMA_3_8B.num_params and not LLAMA_3_8B.is_moe
    assert get_model_shape("Mixtral-8x7B-v0.1") is MIXTRAL_8X7B and get_model_shape("qwen3-30b-a3b") is QWEN3_30B_A3B


@pytest.mark.parametrize("which", ["mixtral", "qwen3_moe", "qwen3_moe_mixed"])
def test_from_hf_config_counts_what_transformers_builds(which):
    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig

    if which == "mixtral":  # built small (a full Mixtral takes seconds even on the meta device); the preset below
        cfg, preset = MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=1, num_local_experts=4), None
        assert ModelShape.from_hf_config(MixtralConfig().to_dict()).with_(name="Mixtral-8x7B") == MIXTRAL_8X7B
    elif which == "qwen3_moe":
        cfg, preset = _qwen3_moe_config(), QWEN3_30B_A3B
    else:  # dense layers among the sparse ones: every 2nd layer sparse, layer 3 forced dense -> 1, 5 sparse
        cfg = _qwen3_moe_config(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                                num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                num_experts=4, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3])
        preset = None
    shape = ModelShape.from_hf_config(cfg.to_dict())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    if preset is not None:
        assert shape.with_(name=preset.name) == preset
    elif which == "qwen3_moe_mixed":
        assert shape.sparse_layers == 2 and shape.expert_width == 8


def test_moe_fields_are_checked_by_name():
    for bad, field in ((dict(top_k=5), "top_k"), (dict(top_k=0), "top_k"), (dict(num_sparse_layers=3),
                                                                             "num_sparse_layers"),
                       (dict(expert_intermediate_size=0), "expert_intermediate_size")):
        with pytest.raises(ValueError, match=field):
            TINY_MOE.with_(**bad)
    with pytest.raises(ValueError, match="need num_experts"):
        LLAMA_3_8B.with_(top_k=2)
    with pytest.raises(ValueError, match="num_tokens"):
        TINY_MOE.expected_experts_hit(-1)


def test_expected_experts_hit_is_what_uniform_routing_hits():
    rng = random.Random(0)
    s = QWEN3_30B_A3B
    assert s.expected_experts_hit(0) == 0 and s.expected_experts_hit(1) == pytest.approx(s.top_k)
    for tokens in (1, 4, 16, 64):
        trials = [len({e for _ in range(tokens) for e in rng.sample(range(s.num_experts), s.top_k)})
                  for _ in range(400)]
        assert sum(trials) / len(trials) == pytest.approx(s.expected_experts_hit(tokens), rel=0.02)
    assert s.expected_experts_hit(4096) == pytest.approx(s.num_experts)


def test_a_decode_step_reads_the_experts_it_hits_not_all_of_them():
    s, m = MIXTRAL_8X7B, StepCostModel("h100", MIXTRAL_8X7B)
    h, L = s.hidden_size, s.num_layers
    non_expert = sum(k * n for k, n in s.attention_linear_shapes()) + s.router_params
    one = m.cost([(1, 1000, 1)])
    # one token: its 2 experts in every layer, the attention and router GEMMs, and the LM head, at 2 bytes
    assert one.weight_bytes == 2 * (L * (non_expert + s.top_k * s.params_per_expert) + s.vocab_size * h)
    assert one.experts_hit == pytest.approx(2)
    big = m.cost([(1, 1000, 1)] * 64)
    assert big.experts_hit == pytest.approx(8, abs=1e-6)  # 64 tokens hit every expert
    assert big.weight_bytes / one.weight_bytes > 3  # decode's bytes grow with the batch, unlike a dense model's
    dense = StepCostModel("h100", LLAMA_3_8B)
    assert dense.cost([(1, 1000, 1)] * 64).weight_bytes == dense.cost([(1, 1000, 1)]).weight_bytes
    # FLOPs follow the active parameters: 2 x tokens x (non-expert + k experts) per layer
    assert big.linear_flops == pytest.approx(2 * 64 * L * (non_expert + s.top_k * s.params_per_expert))


def test_exact_routing_counts_the_experts_and_the_hottest_rank_sets_ep():
    s = TINY_MOE
    m = StepCostModel("h100", s)
    balanced = StepWork.of([(4, 0, 1)], expert_loads=[(2, 2, 2, 2)] * 2)
    skewed = StepWork.of([(4, 0, 1)], expert_loads=[(4, 4, 0, 0)] * 2)
    assert m.cost(balanced).experts_hit == 4 and m.cost(skewed).experts_hit == 2
    assert m.cost(skewed).weight_bytes < m.cost(balanced).weight_bytes  # fewer experts read
    ep = StepCostModel("h100", MIXTRAL_8X7B, tp=2, expert_parallel=True)
    even = [(4,) * 8] * 32  # 16 tokens x top-2 spread over the 8 experts
    hot = [(16, 8, 4, 4, 0, 0, 0, 0)] * 32  # the same pairs, all on rank 0's experts (0-3)
    t_even = ep.cost(StepWork.of([(16, 0, 1)], expert_loads=even))
    t_hot = ep.cost(StepWork.of([(16, 0, 1)], expert_loads=hot))
    assert t_hot.linear_time_s > t_even.linear_time_s  # rank 0 runs all 32 pairs per layer, rank 1 none
    assert t_hot.experts_hit == 4 and t_even.experts_hit == 4
    for bad, match in (([(2, 2, 2, 2)], "1 layers"), ([(2, 2, 2)] * 2, "3 counts"), ([(2, 2, 2, 1)] * 2, "sums to 7"),
                       ([(9, -1, 0, 0)] * 2, "negative")):
        with pytest.raises(ValueError, match=match):
            m.cost(StepWork.of([(4, 0, 1)], expert_loads=bad))


def test_alltoall_bytes_and_the_ep_step():
    s = MIXTRAL_8X7B
    # dispatch and combine per sparse layer; each rank sends its T / ep tokens' remote pairs, hidden x 2 bytes each
    assert alltoall_bytes(s, 64, 2) == 2 * 32 * (64 / 2) * 2 * (1 / 2) * 4096 * 2
    assert alltoall_bytes(s, 64, 1) == 0
    assert alltoall_bytes(s, 64, 2, remote_pairs=[10] * 32) == 2 * 320 / 2 * 4096 * 2
    assert alltoall_time(1e9, 4, 1e11, 1e-5) == pytest.approx(4e-5 + 1e-2)
    tp = StepCostModel("h100", s, tp=2)
    ep = StepCostModel("h100", s, tp=2, expert_parallel=True)
    work = [(1, 1000, 1)] * 32
    assert tp.alltoall_count_and_bytes(work) == (0, 0.0)
    assert ep.alltoall_count_and_bytes(work) == (64, alltoall_bytes(s, 32, 2))
    assert ep.allreduce_count_and_bytes(work)[0] == 32  # attention's only: the MoE's is the all-to-all now
    cost = ep.cost(work)
    assert cost.num_alltoalls == 64 and cost.alltoall_bytes == alltoall_bytes(s, 32, 2)
    assert cost.communication_time_s > tp.cost(work).communication_time_s * 0.5
    with pytest.raises(ValueError, match="expert_parallel needs a mixture-of-experts"):
        StepCostModel("h100", LLAMA_3_8B, tp=2, expert_parallel=True)
    with pytest.raises(ValueError, match="multiple of tp"):
        StepCostModel("h100", s, tp=3, expert_parallel=True)
    with pytest.raises(ValueError, match="not a mixture"):
        alltoall_bytes(LLAMA_3_8B, 4, 2)


# Baseten, "Faster Mixtral inference with TensorRT-LLM and quantization" (2024): Mixtral-8x7B with int8 weights on
# TensorRT-LLM on one A100 (80 GB), a 512-token prompt, 128 output tokens, one request: 127 ms time to first token
# and 81 "perceived tokens per second". We read the latter as 128 tokens over the whole request (TTFT included).
BASETEN_TOKENS_PER_S = 81.0
BASETEN_TTFT_S = 0.127


def test_mixtral_8x7b_int8_batch_1_against_baseten_a100():
    """The modelled request (one 512-token prefill, then 127 decode steps, TensorRT-LLM's host cost as the
    "cuda-graph" profile) is about 22 % faster than measured (98.6 vs 81 tok/s) and its TTFT 38 % shorter (79 vs
    127 ms; the measured TTFT also holds the network and the server). The model prices int8 weights as 1 byte
    read with no dequantization cost, which is where we expect the gap. Tolerance: 25 %, the gap as found, not tuned."""
    m = StepCostModel("a100", shape_for_engine(MIXTRAL_8X7B, "auto", "int8"), engine="cuda-graph")
    ttft = m.cost([(512, 0, 1)]).time_s
    total = ttft + sum(m.cost([(1, 512 + i, 1)]).time_s for i in range(127))
    modelled = 128 / total
    assert modelled == pytest.approx(BASETEN_TOKENS_PER_S, rel=0.25)
    assert modelled > BASETEN_TOKENS_PER_S and ttft < BASETEN_TTFT_S  # the model is optimistic, as reported


def test_exact_balanced_routing_equals_the_uniform_expectation_once_every_expert_is_hit():
    """64 tokens x top-2 over 8 experts, 16 each: the exact path (each expert its own GEMM) and the expected path
    (E experts sharing the pairs evenly) price the same step, with and without EP."""
    for tp, ep in ((1, False), (2, False), (4, True)):
        m = StepCostModel("h100", MIXTRAL_8X7B, tp=tp, expert_parallel=ep)
        work = [(1, 500, 1)] * 64
        exact = m.cost(StepWork.of(work, expert_loads=[(16,) * 8] * 32))
        expected = m.cost(work)
        assert expected.experts_hit == pytest.approx(exact.experts_hit, rel=1e-6)
        assert expected.time_s == pytest.approx(exact.time_s, rel=1e-6)
        assert expected.weight_bytes == pytest.approx(exact.weight_bytes, rel=1e-6)


def test_a_modelled_clock_on_a_moe_shape_prices_the_step_by_its_experts(random_qwen3_moe):
    """An engine on the random Qwen3-MoE checkpoint, timed as Qwen3-30B-A3B on an H100: every step's time is the
    cost model's, and the shape read from the checkpoint is a MoE with its dense layer."""
    from minengine import LLMEngine, SamplingParams
    from minengine.config import EngineConfig
    from minengine.timing import make_clock
    from tests.conftest import drain

    shape = ModelShape.from_hf_config(random_qwen3_moe)
    assert shape.is_moe and shape.num_experts == 8 and shape.sparse_layers == 2 and shape.qk_norm
    clock = make_clock("modelled", hardware="h100", model="qwen3-30b-a3b")
    engine = LLMEngine(EngineConfig(model=random_qwen3_moe, max_model_len=256), clock=clock)
    for i in range(3):
        engine.add_request(f"r{i}", {"prompt_token_ids": list(range(3, 40 + i))},
                           SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    drain(engine)
    costs = clock.costs
    assert len(costs) == len(engine.traces) and all(c.experts_hit > 0 for c in costs)
    model = StepCostModel("h100", "qwen3-30b-a3b")
    assert [c.time_s for c in costs] == [model.cost(StepWork.from_step_trace(t)).time_s for t in engine.traces]


def test_clock_spec_takes_expert_parallel():
    from minengine.timing import ClockSpec

    spec = ClockSpec("modelled", hardware="h100", model="mixtral-8x7b", tp=4, expert_parallel=True)
    assert spec.cost_model().expert_parallel and spec.label == "modelled: H100 SXM, Mixtral-8x7B shapes, EP 4"
    assert ClockSpec("modelled", model="mixtral-8x7b", tp=4).label.endswith("TP 4")
    with pytest.raises(ValueError, match="expert_parallel needs a mixture-of-experts"):
        ClockSpec("modelled", model="llama-3-8b", tp=2, expert_parallel=True)
