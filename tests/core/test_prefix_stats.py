"""Prefix-cache hit statistics count first admissions only (as vLLM PR #25787 made them): a
recompute-preempted request that re-hits its own freed blocks on re-admission is reported apart
(``readmission_hit_tokens``, in the trace and the summary), not as a prefix-cache hit."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLM, SamplingParams
from minengine.workloads import SHAKESPEARE_OPENINGS
from tests.fake_engine import FakeEngine


def test_recompute_rehits_are_not_prefix_cache_hits(bundled_model):
    """6 unrelated prompts in a pool small enough to preempt: no request gets a cached prefix, so the hit rate
    is 0 (re-hits counted as hits once made it "48 of 458"), and the re-hits are reported apart."""
    llm = LLM(bundled_model, max_model_len=256, num_kv_blocks=16, block_size=8, max_num_batched_tokens=64)
    outs = llm.generate(SHAKESPEARE_OPENINGS[:6], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)
    s = llm.llm_engine.summary()
    assert s.num_preemptions > 0 and all(o.num_cached_tokens == 0 for o in outs)
    assert s.prefix_hit_tokens == 0 and s.prefix_hit_rate == 0
    assert s.prefix_queried_tokens == sum(len(o.prompt_token_ids) for o in outs)  # each prompt once
    assert s.readmission_hit_tokens > 0
    assert s.readmission_hit_tokens == sum(t.readmission_hit_tokens for t in llm.llm_engine.traces)
    assert "re-admission prefix hit tokens" in s.as_table()


def test_shared_prefix_hits_still_count(bundled_model):
    llm = LLM(bundled_model, max_model_len=256, max_num_batched_tokens=256)
    system = "KING RICHARD III:\nNow is the winter of our discontent\nMade glorious summer by this sun of York;"
    outs = llm.generate([system + " A", system + " B"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    s = llm.llm_engine.summary()
    assert s.prefix_hit_tokens == sum(o.num_cached_tokens for o in outs) > 0
    assert s.readmission_hit_tokens == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(6, 40), block_size=st.sampled_from([1, 2, 4, 8]), budget=st.integers(4, 64),
       mode=st.sampled_from(["recompute", "swap"]),
       work=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 2)), min_size=1, max_size=8))
def test_hit_statistics_are_first_admissions(num_blocks, block_size, budget, mode, work):
    """On random workloads (shared prefixes, preemptions): the hit tokens summed over steps are the requests'
    own ``num_cached_tokens`` and the queried tokens their prompt lengths, each request counted once."""
    eng = FakeEngine(num_blocks=num_blocks, block_size=block_size, budget=budget, max_model_len=10_000,
                     preemption_mode=mode, swap_blocks=num_blocks // 2)
    for i, (plen, max_tokens, family) in enumerate(work):
        if -(-(plen + max_tokens) // block_size) <= num_blocks:
            eng.add(str(i), [(family * 13 + j) % 20 + 3 for j in range(plen)], max_tokens)
    eng.run()
    assert sum(o.prefix_hit_tokens for o in eng.outputs) == sum(r.num_cached_tokens for r in eng.finished)
    assert sum(o.prefix_queried_tokens for o in eng.outputs) == sum(r.num_prompt_tokens for r in eng.finished)
