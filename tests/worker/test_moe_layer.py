"""The mixture-of-experts layer: top-k gating as each architecture normalises it (checked against transformers'
routers), the reference layer against a token-by-token definition and transformers' sparse blocks, and the grouped
path against the reference for any token count, top-k and expert count."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.layers import moe
from minengine.layers.moe import SparseMoeBlock, expert_mlp, moe_grouped, moe_reference
from minengine.layers.moe_routing import route


def random_experts(num_experts: int, hidden: int, inter: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_experts, inter, hidden, generator=g) * 0.2,
            torch.randn(num_experts, inter, hidden, generator=g) * 0.2,
            torch.randn(num_experts, hidden, inter, generator=g) * 0.2)


def token_by_token(x, weights, ids, gate_proj, up_proj, down_proj):
    """The definition, one token and one slot at a time."""
    rows = []
    for t in range(x.shape[0]):
        row = torch.zeros(x.shape[1])
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            row += weights[t, j] * expert_mlp(x[t:t + 1], gate_proj[e], up_proj[e], down_proj[e])[0]
        rows.append(row)
    return torch.stack(rows)


def test_mixtral_gating_is_a_softmax_over_the_top_k_logits():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    cfg = MixtralConfig(hidden_size=16, num_local_experts=6, num_experts_per_tok=2)
    router = MixtralTopKRouter(cfg)
    torch.nn.init.normal_(router.weight, std=0.5)
    x = torch.randn(20, 16)
    logits = x @ router.weight.T
    weights, ids = route(logits, 2, "topk_softmax")
    _, hf_weights, hf_ids = router(x)
    assert torch.equal(ids, hf_ids) and torch.allclose(weights, hf_weights, atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(20))
    assert torch.allclose(weights, torch.softmax(logits.gather(1, ids), dim=-1))


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_qwen3_moe_gating_is_a_softmax_over_all_experts_then_top_k(norm_topk_prob):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    cfg = Qwen3MoeConfig(hidden_size=16, num_experts=8, num_experts_per_tok=3, norm_topk_prob=norm_topk_prob)
    router = Qwen3MoeTopKRouter(cfg)
    torch.nn.init.normal_(router.weight, std=0.5)
    x = torch.randn(20, 16)
    weights, ids = route(x @ router.weight.T, 3, "softmax_topk", renormalize=norm_topk_prob)
    _, hf_weights, hf_ids = router(x)
    assert torch.equal(ids, hf_ids) and torch.allclose(weights, hf_weights, atol=1e-6)
    sums = weights.sum(-1)
    assert torch.allclose(sums, torch.ones(20)) if norm_topk_prob else bool((sums < 1).all())


def test_routing_rejects_bad_arguments():
    logits = torch.randn(3, 4)
    with pytest.raises(ValueError, match="top_k"):
        route(logits, 5, "topk_softmax")
    with pytest.raises(ValueError, match="top_k"):
        route(logits, 0, "softmax_topk")
    with pytest.raises(ValueError, match="routing must be one of"):
        route(logits, 2, "sigmoid")


def test_the_reference_layer_is_the_definition():
    experts = random_experts(5, 12, 8)
    x = torch.randn(9, 12)
    weights, ids = route(torch.randn(9, 4), 2, "topk_softmax")  # logits for experts 0-3: expert 4 stays idle
    want = token_by_token(x, weights, ids, *experts)
    assert torch.allclose(moe_reference(x, weights, ids, *experts), want, atol=1e-5)
    assert torch.allclose(moe_grouped(x, weights, ids, *experts), want, atol=1e-5)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_the_block_matches_transformers_sparse_block(arch):
    """Same router and expert weights in both: the block's output equals transformers' (float32)."""
    import transformers

    if arch == "mixtral":
        cfg = transformers.MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=6,
                                         num_experts_per_tok=2)
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as HFBlock
        ours = SparseMoeBlock(16, 24, 6, 2, "topk_softmax")
    else:
        cfg = transformers.Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=24, num_experts=6,
                                          num_experts_per_tok=2, norm_topk_prob=False)
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as HFBlock
        ours = SparseMoeBlock(16, 24, 6, 2, "softmax_topk", renormalize=False)
    theirs = HFBlock(cfg).eval()
    gate, up, down = random_experts(6, 16, 24, seed=3)
    with torch.no_grad():
        theirs.gate.weight.normal_(0, 0.5)
        theirs.experts.gate_up_proj.copy_(torch.cat([gate, up], dim=1))
        theirs.experts.down_proj.copy_(down)
        ours.gate.weight.copy_(theirs.gate.weight)
        ours.experts.gate_proj.copy_(gate), ours.experts.up_proj.copy_(up), ours.experts.down_proj.copy_(down)
        x = torch.randn(1, 30, 16)
        want = theirs(x)[0]
        for implementation in ("reference", "grouped"):
            ours.implementation = implementation
            assert torch.allclose(ours(x[0]), want, atol=1e-5), implementation


@settings(max_examples=40, deadline=None)
@given(num_tokens=st.integers(1, 40), num_experts=st.integers(1, 9), data=st.data(),
       routing=st.sampled_from(["topk_softmax", "softmax_topk"]), seed=st.integers(0, 2 ** 16))
def test_grouped_equals_reference(num_tokens, num_experts, data, routing, seed):
    top_k = data.draw(st.integers(1, num_experts), label="top_k")
    experts = random_experts(num_experts, 8, 6, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, 8, generator=g)
    weights, ids = route(torch.randn(num_tokens, num_experts, generator=g), top_k, routing, renormalize=False)
    want = moe_reference(x, weights, ids, *experts)
    assert torch.allclose(moe_grouped(x, weights, ids, *experts), want, atol=1e-5)


@pytest.mark.parametrize("grouped_mm", [False, True])
def test_grouped_gives_the_reference_sum_with_and_without_torch_grouped_mm(monkeypatch, grouped_mm):
    """One GEMM per run of an expert's rows (the CPU's path) and ``torch._grouped_mm`` (a GPU's, run here on the CPU
    where this torch has it) give the reference's result."""
    if grouped_mm and not moe.grouped_mm_works("cpu", torch.float32):
        pytest.skip("this torch has no CPU torch._grouped_mm")
    experts = random_experts(6, 8, 16, seed=1)  # rows of 32 and 64 bytes: torch._grouped_mm takes them
    x = torch.randn(25, 8)
    weights, ids = route(torch.randn(25, 5), 3, "softmax_topk")  # expert 5 idle: an empty run
    want = moe_reference(x, weights, ids, *experts)
    calls = []
    real = torch._grouped_mm if grouped_mm else None
    monkeypatch.setattr(moe, "_use_grouped_mm", lambda device_type, dtype: grouped_mm)
    if grouped_mm:
        monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert torch.allclose(moe_grouped(x, weights, ids, *experts), want, atol=1e-5)
    assert len(calls) == (3 if grouped_mm else 0)  # gate, up, down


def test_an_unknown_implementation_is_refused():
    from minengine.models.moe import set_moe_implementation

    block = SparseMoeBlock(8, 6, 4, 2, "topk_softmax")
    assert set_moe_implementation(torch.nn.Sequential(block), "reference") == 1 and block.implementation == "reference"
    with pytest.raises(ValueError, match="MoE implementation must be one of"):
        set_moe_implementation(block, "dense")
