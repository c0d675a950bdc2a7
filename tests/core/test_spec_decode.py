"""Speculative decoding by prompt lookup: proposals, one token budget, exact outputs.

Greedy outputs with k in {1, 2, 4, 8} speculative tokens are token-identical to transformers' under chunked
prefill, prefix caching, preemption by recompute and by swap, and every policy; the KV shadow (``KVShadow``)
checks after every step that no request's computed tokens and no prefix-cache entry point at a rejected
proposal's K/V, and that a block used only by rejected proposals is given back. Stops, penalties, logprobs,
seeded sampling, n > 1, the CUDA-graph path, rollback, metrics and the modelled clock compose with it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from minengine import LLM, EngineConfig, LLMEngine, SamplingParams
from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.policies import POLICIES
from minengine.core.spec_decode import NgramProposer, SpecDecodeStats, SpeculativeConfig, accepted_prefix
from minengine.request import Request
from minengine.timing import StepCostModel, StepWork
from tests.conftest import drain, hf_greedy
from tests.kv_shadow import check_scheduler, watch_runner

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
LINE = "ROMEO:\nO, she doth teach the torches to burn bright!\n"  # repeated: the model copies it


def spec(k: int, lo: int = 2, hi: int = 4) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}


# ---- the config ------------------------------------------------------------------------------------------
def test_speculative_config_defaults_and_validation():
    assert SpeculativeConfig() == SpeculativeConfig("ngram", 4, 5, 5)  # vLLM's defaults: 5 and 5
    assert SpeculativeConfig(prompt_lookup_max=3).prompt_lookup_min == 3
    assert SpeculativeConfig(prompt_lookup_min=2).prompt_lookup_max == 2
    c = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert c.speculative_config.num_speculative_tokens == 3
    assert EngineConfig().speculative_config is None
    for bad, field in (({"method": "eagle"}, "method"), ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
                       ({"num_speculative_tokens": 65}, "num_speculative_tokens"),
                       ({"num_speculative_tokens": True}, "num_speculative_tokens"),
                       ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
                       ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
                       ({"model": "draft"}, "unknown keys"), ("ngram", "speculative_config must be a dict")):
        with pytest.raises(ValueError, match=field):
            EngineConfig(speculative_config=bad)


# ---- the proposer ------------------------------------------------------------------------------------------
def make_request(tokens: list[int], num_prompt: int | None = None) -> Request:
    num_prompt = len(tokens) if num_prompt is None else num_prompt
    r = Request("r", tokens[:num_prompt], SamplingParams(max_tokens=100), 0.0)
    r.output_token_ids = tokens[num_prompt:]
    return r


def reference_proposal(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """vLLM's rule, by brute force: the longest n in [lo, hi] whose suffix occurs earlier (an occurrence with at
    least one token after it), its earliest occurrence, then up to k tokens after it."""
    for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for start in range(0, len(tokens) - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_proposer_longest_ngram_earliest_occurrence():
    p = NgramProposer(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3))
    # suffix [1, 2, 3] occurs at 0 and at 5: the earliest wins; the tokens after it are proposed
    assert p.propose(make_request([1, 2, 3, 4, 9, 1, 2, 3, 7, 8, 1, 2, 3])) == [4, 9, 1]
    assert p.propose(make_request([5, 6, 7])) == []  # no earlier occurrence
    assert p.propose(make_request([1, 2, 3, 4, 1, 2, 3]), max_tokens=1) == [4]  # capped
    assert p.propose(make_request([1, 2, 3, 4, 1, 2, 3]), max_tokens=0) == []
    assert p.propose(make_request([7, 7])) == [7]  # an occurrence overlapping the suffix counts (as vLLM)


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=40), k=st.integers(1, 8), lo=st.integers(1, 3),
       extra=st.integers(0, 2), grow=st.lists(st.integers(0, 4), max_size=12), split=st.integers(0, 40))
def test_proposer_matches_brute_force_as_tokens_grow(tokens, k, lo, extra, grow, split):
    """The incremental index gives vLLM's proposal at every length, the prompt/output split anywhere."""
    hi = lo + extra
    proposer = NgramProposer(SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=lo, prompt_lookup_max=hi))
    request = make_request(tokens, min(split, len(tokens)) or None)
    for t in [None] + grow:
        if t is not None:
            request.output_token_ids.append(t)
        all_tokens = request.prompt_token_ids + request.output_token_ids
        want = reference_proposal(all_tokens, k, lo, hi) if len(all_tokens) > lo else []
        assert proposer.propose(request) == want


def test_accepted_prefix_and_stats():
    assert accepted_prefix([1, 2, 3], [1, 2, 9]) == 2
    assert accepted_prefix([1, 2], [5, 2]) == 0
    assert accepted_prefix([], [4]) == 0
    stats = SpecDecodeStats(2, 8, 5, (2, 2, 1))
    assert stats.acceptance_rate == 5 / 8 and stats.mean_acceptance_length == 1 + 5 / 2
    assert math.isnan(SpecDecodeStats().acceptance_rate)


# ---- the scheduler: one token budget, free blocks only ------------------------------------------------------
def decoding_scheduler(budget: int, num_blocks: int, k: int = 4):
    kv = KVCacheManager(num_blocks, 4, True)
    sched = make_scheduler(kv, 64, 8, 1000, speculative_config=spec(k, 1, 3))
    r = Request("a", [1, 2, 3, 4, 5, 6, 7, 1, 2], SamplingParams(temperature=0, max_tokens=50), 0.0)
    sched.add_request(r)
    out = sched.schedule()
    sched.update_from_output(out, {"a": [3]})  # prompt done; tokens ... 1 2 3: proposals 4 5 6 7
    sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=budget)
    return sched, r


def test_speculative_tokens_count_in_the_token_budget():
    sched, r = decoding_scheduler(budget=3, num_blocks=16)
    out = sched.schedule()
    (s,) = out.scheduled
    assert s.token_ids == [3, 4, 5] and s.spec_token_ids == [4, 5]  # 1 + 2 proposals fill the budget of 3
    assert out.num_scheduled_tokens == 3 and s.num_sampled == 3 and out.num_spec_tokens == 2 and not s.is_prefill
    sched.update_from_output(out, {"a": [4, 9]})  # first proposal accepted, then the model's own token
    assert r.output_token_ids == [3, 4, 9] and r.num_computed_tokens == 11 and r.is_decode
    check_scheduler(sched)  # blocks == cdiv(computed): the block only the rejected proposal used is back


def test_speculation_never_preempts():
    """Proposals use free blocks only: with none free the decode runs plainly, nobody is preempted."""
    sched, r = decoding_scheduler(budget=64, num_blocks=3)  # 3 blocks of 4 = 12 slots, all held by "a"
    assert sched.kv.num_free_blocks == 0 and r.num_computed_tokens == 9
    out = sched.schedule()
    (s,) = out.scheduled
    assert not out.preempted_ids  # the proposals (4 wanted) are cut to slots 10, 11 of the blocks held
    assert s.spec_token_ids == [4, 5] and s.num_new_tokens == 3 and len(s.block_ids) == 3


def test_speculation_leaves_a_block_for_a_later_decode_of_the_step():
    """Proposals do not take the free block a running request scheduled later in the same step needs for its
    next token: nobody is preempted, and the speculating request proposes within the blocks it holds."""
    kv = KVCacheManager(6, 4, True)
    sched = make_scheduler(kv, 64, 8, 1000, speculative_config=spec(4, 1, 3))
    a = Request("a", [1, 2, 3, 4, 5, 6, 7, 1, 2], SamplingParams(temperature=0, max_tokens=50), 0.0)  # 3 blocks
    b = Request("b", [9, 10, 11, 12, 13, 14, 15, 16], SamplingParams(temperature=0, max_tokens=50), 0.0)  # 2
    sched.add_request(a)
    sched.add_request(b)
    sched.update_from_output(sched.schedule(), {"a": [3], "b": [20]})
    assert kv.num_free_blocks == 1 and b.num_computed_tokens == 8  # b's next token needs the free block
    out = sched.schedule()
    assert not out.preempted_ids
    s_a, s_b = out.scheduled
    assert s_a.spec_token_ids == [4, 5]  # slots 10, 11 of a's own third block, not the free block
    assert s_b.num_new_tokens == 1 and len(s_b.block_ids) == 3


def test_proposals_stop_at_max_tokens_and_max_model_len():
    kv = KVCacheManager(64, 4, False)
    sched = make_scheduler(kv, 64, 8, 1000, speculative_config=spec(8, 1, 3))
    r = Request("a", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(temperature=0, max_tokens=3), 0.0)
    sched.add_request(r)
    sched.update_from_output(sched.schedule(), {"a": [3]})
    (s,) = sched.schedule().scheduled
    assert len(s.spec_token_ids) == 1  # 2 tokens left to generate: the decode's own + 1 proposal


def test_acceptance_metrics_in_trace_summary_and_prometheus(bundled_model):
    engine = LLMEngine(EngineConfig(model=bundled_model, max_model_len=512, speculative_config=SPEC))
    ids = engine.tokenizer(LINE * 6)["input_ids"]
    engine.add_request("a", {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    drain(engine)
    chunks = [c for t in engine.traces for c in t.chunks if c.num_spec_tokens]
    assert chunks and all(c.num_tokens == 1 + c.num_spec_tokens and not c.is_prefill for c in chunks)
    s = engine.summary()
    assert s.spec_num_drafts == len(chunks) and s.spec_draft_tokens == sum(c.num_spec_tokens for c in chunks)
    assert s.spec_accepted_tokens == sum(c.num_accepted_tokens for c in chunks)
    assert s.spec_acceptance_rate > 0.5, s.spec_acceptance_rate  # heavy repetition: most proposals right
    assert s.spec_mean_acceptance_length == 1 + s.spec_accepted_tokens / s.spec_num_drafts
    assert "speculative" in s.as_table()
    assert len(engine.traces) < 48  # fewer steps than tokens
    text = generate_latest(engine.stat_logger.registry).decode()
    assert f"vllm:spec_decode_num_drafts_total{{engine=\"0\",model_name=\"tiny-shakespeare-llama\"}} " \
           f"{float(s.spec_num_drafts)}" in text
    assert f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\",model_name=\"tiny-shakespeare-llama\"}} " \
           f"{float(s.spec_draft_tokens)}" in text
    assert f"vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\",model_name=\"tiny-shakespeare-llama\"}} " \
           f"{float(s.spec_accepted_tokens)}" in text
    per_pos = SpecDecodeStats.of_steps(engine.traces).num_accepted_tokens_per_pos
    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny-shakespeare-llama",' \
           f'position="0"}} {float(per_pos[0])}' in text
    assert "vllm:generation_tokens_total{engine=\"0\",model_name=\"tiny-shakespeare-llama\"} 48.0" in text
    m = engine.request_metrics["a"]
    assert len(m.itls) == 47 and m.tpot is not None  # one gap per token (0 within a verified run)
    assert "spec_decode" not in generate_latest(LLMEngine(EngineConfig(model=bundled_model)).stat_logger.registry
                                                ).decode()  # no speculation, no series (as vLLM)


# ---- exactness against transformers --------------------------------------------------------------------------
def repetitive_prompts(tokenizer, bundled_prompts) -> list[list[int]]:
    """Prompts the bundled model copies from (a line repeated; a passage and its start again) and plain ones."""
    line = tokenizer(LINE * 4)["input_ids"]
    passage = bundled_prompts[-1][:120]
    return [line, passage + passage[:30], bundled_prompts[3], bundled_prompts[-1][300:480], [5]]


SETTINGS = {
    "chunk-16": dict(max_num_batched_tokens=16),
    "chunk-64-prefix": dict(max_num_batched_tokens=64, enable_prefix_caching=True),
    "recompute": dict(max_num_batched_tokens=128, num_kv_blocks=30, preemption_mode="recompute"),
    "swap": dict(max_num_batched_tokens=128, num_kv_blocks=30, preemption_mode="swap"),
}


def run_engine(model: str, prompts: list[list[int]], max_new: int, **config) -> LLMEngine:
    """Step an engine over the prompts with the KV shadow checked after every step; returns it."""
    engine = LLMEngine(EngineConfig(model=model, max_model_len=1024, **config))
    shadow = watch_runner(engine)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p},
                           SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True))
    engine.outputs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                engine.outputs[o.request_id] = o.outputs[0].token_ids
        check_scheduler(engine.scheduler)
        shadow.check(engine.scheduler)
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks  # every block free again
    return engine


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_matches_transformers(bundled_model, bundled_prompts, k, name):
    prompts = repetitive_prompts(_tokenizer(bundled_model), bundled_prompts)
    engine = run_engine(bundled_model, prompts, 24, speculative_config=spec(k), **SETTINGS[name])
    for i, p in enumerate(prompts):
        assert engine.outputs[f"r{i}"] == hf_greedy(bundled_model, tuple(p), 24), f"prompt {i}"
    s = engine.summary()
    assert s.spec_accepted_tokens > 0 and s.spec_draft_tokens > s.spec_accepted_tokens  # accepted AND rejected
    if name in ("recompute", "swap"):
        assert s.num_preemptions > 0
    if name == "swap":
        assert s.num_swapped_out_blocks > 0
    if name.startswith("chunk"):  # a step mixed a prefill chunk with speculative decodes
        assert any(t.num_prefill_tokens and t.num_spec_tokens for t in engine.traces)


def test_prefix_hits_on_blocks_that_held_rejected_proposals(bundled_model):
    """A request whose prompt is an earlier request's prompt + output hits the prefix cache on blocks the earlier
    decode wrote while verifying (and rejecting) proposals: what is cached is the accepted tokens' K/V only, so
    the second request's greedy tokens are still transformers'."""
    tok = _tokenizer(bundled_model)
    first = tok(LINE * 3 + "JULIET:\nGood night")["input_ids"]
    engine = LLMEngine(EngineConfig(model=bundled_model, max_model_len=1024, enable_prefix_caching=True,
                                    max_num_batched_tokens=32, speculative_config=spec(4, 1, 3)))
    shadow = watch_runner(engine)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outputs = {}
    for rid, prompt in (("r0", first), ("r1", None)):
        if prompt is None:
            prompt = first + outputs["r0"][:33]  # ends inside the blocks written by verified steps
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    outputs[rid] = o.outputs[0].token_ids
            check_scheduler(engine.scheduler)
            shadow.check(engine.scheduler)
        assert outputs[rid] == hf_greedy(bundled_model, tuple(prompt), 40), rid
    s = engine.summary()
    assert s.spec_draft_tokens > s.spec_accepted_tokens > 0
    assert s.prefix_hit_tokens >= (len(first) + 32) // 16 * 16  # the hit covers blocks of r0's output
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


_TOKENIZERS = {}


def _tokenizer(model: str):
    if model not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[model] = AutoTokenizer.from_pretrained(model)
    return _TOKENIZERS[model]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_matches_transformers(bundled_model, bundled_prompts, policy):
    prompts = repetitive_prompts(_tokenizer(bundled_model), bundled_prompts)
    engine = run_engine(bundled_model, prompts, 24, speculative_config=SPEC, scheduling_policy=policy,
                        max_num_batched_tokens=48, num_kv_blocks=40, max_num_seqs=3)
    for i, p in enumerate(prompts):
        assert engine.outputs[f"r{i}"] == hf_greedy(bundled_model, tuple(p), 24), f"{policy}: prompt {i}"
    assert engine.summary().spec_accepted_tokens > 0


def test_random_text_low_acceptance_same_tokens(random_llama):
    """A random-weight model on random tokens rarely repeats: few proposals, most rejected, same tokens."""
    g = random.Random(0)
    prompts = [[g.randrange(3, 512) for _ in range(n)] for n in (40, 90, 200)]
    on = run_engine(random_llama, prompts, 32, speculative_config=spec(4, 1, 3))
    off = run_engine(random_llama, prompts, 32)
    for i, p in enumerate(prompts):
        assert on.outputs[f"r{i}"] == off.outputs[f"r{i}"] == hf_greedy(random_llama, tuple(p), 32)
    s = on.summary()
    assert s.spec_draft_tokens > 0 and s.spec_acceptance_rate < 0.3, s.spec_acceptance_rate


# ---- stops, penalties, logprobs, sampling, n > 1 -------------------------------------------------------------
def both(model: str, prompt, params: SamplingParams, **config):
    """The final RequestOutput with speculation on and off."""
    outs = []
    for sc in (SPEC, None):
        llm = LLM(model, max_model_len=512, speculative_config=sc, **config)
        (o,) = llm.generate([prompt], params, use_tqdm=False)
        outs.append(o)
        assert llm.llm_engine.kv_cache_manager.num_free_blocks == llm.llm_engine.num_kv_blocks
    return outs


def test_stops_inside_a_run_of_accepted_tokens(bundled_model):
    """EOS-like stop token ids, max_tokens and stop strings falling inside a verified run: the output ends
    exactly where it ends without speculation (text, tokens, reasons)."""
    prompt = LINE * 4
    (ref,) = LLM(bundled_model, max_model_len=512).generate([prompt], SamplingParams(temperature=0, max_tokens=40),
                                                           use_tqdm=False)
    tokens = ref.outputs[0].token_ids
    cases = [SamplingParams(temperature=0, max_tokens=n) for n in (3, 7, 13)]
    cases += [SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[tokens[i]]) for i in (5, 11)]
    cases += [SamplingParams(temperature=0, max_tokens=40, stop=[ref.outputs[0].text[9:14]]),
              SamplingParams(temperature=0, max_tokens=40, stop=[ref.outputs[0].text[9:14]],
                             include_stop_str_in_output=True)]
    for params in cases:
        on, off = both(bundled_model, prompt, params)
        a, b = on.outputs[0], off.outputs[0]
        assert (a.token_ids, a.text, a.finish_reason, a.stop_reason) == (b.token_ids, b.text, b.finish_reason,
                                                                          b.stop_reason), params


def test_penalties_logprobs_min_tokens_seeded_sampling(bundled_model):
    """The sampler verifies row by row with the processing and the per-token generator a plain step would
    use, so penalties, min_tokens and seeded sampling give the same tokens, and logprobs the same values."""
    prompt = LINE * 4
    cases = [SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3, frequency_penalty=0.2,
                            presence_penalty=0.1, logprobs=3),
             SamplingParams(temperature=0, max_tokens=20, min_tokens=10, logprobs=0),
             SamplingParams(temperature=0.7, top_p=0.9, top_k=20, min_p=0.01, max_tokens=30, seed=7, logprobs=2),
             SamplingParams(temperature=1.0, max_tokens=30, seed=3, presence_penalty=0.5)]
    for params in cases:
        on, off = both(bundled_model, prompt, params)
        a, b = on.outputs[0], off.outputs[0]
        assert a.token_ids == b.token_ids, params
        if params.logprobs is not None:
            assert len(a.logprobs) == len(b.logprobs) == len(a.token_ids)
            for pa, pb in zip(a.logprobs, b.logprobs):
                assert set(pa) == set(pb)
                for tid in pa:
                    assert pa[tid].logprob == pytest.approx(pb[tid].logprob, abs=1e-4)
            assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-3)


def test_speculation_is_used_by_sampling_requests(bundled_model):
    llm = LLM(bundled_model, max_model_len=512, speculative_config=SPEC)
    llm.generate([LINE * 4], SamplingParams(temperature=0.3, max_tokens=40, seed=1), use_tqdm=False)
    s = llm.llm_engine.summary()
    assert s.spec_accepted_tokens > 0


def test_parallel_sampling_n_greater_than_one(bundled_model):
    params = SamplingParams(n=3, temperature=0.8, max_tokens=24, seed=11)
    on, off = both(bundled_model, LINE * 3, params)
    assert [c.token_ids for c in on.outputs] == [c.token_ids for c in off.outputs]
    assert len({tuple(c.token_ids) for c in on.outputs}) > 1


# ---- rollback, CUDA-graph path, modelled clock ----------------------------------------------------------------
def test_failed_speculative_step_rolls_back(bundled_model, bundled_prompts):
    """A step with proposals that raises is undone (blocks, progress, no prefix-cache entry); the run then
    finishes with transformers' tokens."""
    prompts = repetitive_prompts(_tokenizer(bundled_model), bundled_prompts)[:3]
    engine = LLMEngine(EngineConfig(model=bundled_model, max_model_len=1024, speculative_config=SPEC,
                                    max_num_batched_tokens=64))
    shadow = watch_runner(engine)
    execute = engine.runner.execute
    failures = []

    def flaky(out):
        if out.num_spec_tokens and len(failures) < 3 and random.Random(len(engine.traces)).random() < 0.5:
            failures.append(len(engine.traces))
            raise RuntimeError("injected")
        return execute(out)

    engine.runner.execute = flaky
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=24,
                                                                             ignore_eos=True))
    final = {}
    while engine.has_unfinished_requests():
        try:
            outs = engine.step()
        except RuntimeError:
            check_scheduler(engine.scheduler)
            shadow.check(engine.scheduler)
            continue
        final.update({o.request_id: o.outputs[0].token_ids for o in outs if o.finished})
        check_scheduler(engine.scheduler)
        shadow.check(engine.scheduler)
    assert len(failures) == 3
    for i, p in enumerate(prompts):
        assert final[f"r{i}"] == hf_greedy(bundled_model, tuple(p), 24)
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_cuda_graph_path_falls_back_to_eager_for_speculative_steps(random_llama):
    """On every step of a speculative run, the decode graphs (``DecodeGraphs.supports``, which
    ``ModelRunner.execute`` asks before replaying) take exactly the decode-only steps of one token per request: never
    a step that verifies proposals, nor one with a prefill chunk. A graph runner builds each step's inputs as the
    Triton backend does and is asked; the forward itself runs on the default attention path (the Triton interpreter
    would only make the run slower: a replayed step's tokens are checked in ``tests/worker/test_cuda_graphs.py``).
    The tokens are transformers' greedy ones."""
    pytest.importorskip("triton")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from minengine.worker.model_runner import ModelRunner

    g = random.Random(1)
    base = [g.randrange(3, 512) for _ in range(12)]
    prompts = [base * 3, base[:7] * 4, [g.randrange(3, 512) for _ in range(9)]]
    llm = LLM(random_llama, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
              speculative_config=spec(4, 1, 3))
    e = llm.llm_engine
    graph_runner = ModelRunner(e.model, e.num_kv_blocks, e.config.block_size, seed=e.config.seed,
                               attention_backend="triton", cuda_graphs=True, max_num_seqs=4)
    execute, decisions = e.runner.execute, []

    def ask_the_graphs(out):
        if not out.is_empty:
            one_token_decodes = all(not s.is_prefill and s.num_spec_tokens == 0 for s in out.scheduled)
            decisions.append((out.num_spec_tokens, one_token_decodes,
                              graph_runner.graphs.supports(graph_runner.prepare_inputs(out))))
        return execute(out)

    e.runner.execute = ask_the_graphs
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(random_llama, tuple(p), 12)
    assert all(supported == one_token_decodes for _, one_token_decodes, supported in decisions), decisions
    assert any(num_spec for num_spec, _, _ in decisions) and any(supported for _, _, supported in decisions)
    assert e.summary().spec_draft_tokens > 0


def test_modelled_clock_costs_the_verified_rows():
    """num_sampled = 1 + k: a decode verifying 4 proposals costs the LM head 5 times and 5 tokens' FLOPs."""
    kv = KVCacheManager(64, 4, False)
    sched = make_scheduler(kv, 64, 8, 1000, speculative_config=spec(4, 1, 3))
    r = Request("a", [1, 2, 3, 4, 5, 6, 1, 2, 3], SamplingParams(temperature=0, max_tokens=50), 0.0)
    sched.add_request(r)
    sched.update_from_output(sched.schedule(), {"a": [4]})
    out = sched.schedule()
    work = StepWork.from_scheduler_output(out)
    assert work.requests[0].num_new_tokens == 5 and work.requests[0].num_sampled == 5
    m = StepCostModel("h100", "llama-3-8b")
    plain = m.cost([(1, 10, 1)])
    assert m.cost_of(out).lm_head_flops == pytest.approx(5 * plain.lm_head_flops)
    assert m.cost_of(out).time_s > plain.time_s
