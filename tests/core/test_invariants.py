"""Property tests (hypothesis): on random workloads and configs, after every step: tokens <= token budget,
sequences <= max_num_seqs, each block's ref count == number of block tables holding it, no block both free
and referenced; after the workload every block is free and every request finished."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLMEngine, SamplingParams
from tests.fake_engine import FakeEngine

configs = st.fixed_dictionaries({
    "num_blocks": st.integers(8, 64),
    "block_size": st.sampled_from([1, 2, 4, 16]),
    "budget": st.integers(1, 96),
    "max_num_seqs": st.integers(1, 8),
    "threshold": st.integers(0, 24),
    "prefix": st.booleans(),
})
workloads = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12), st.integers(0, 3), st.integers(0, 6)),
                     min_size=1, max_size=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, work=workloads)
def test_scheduler_invariants_random(cfg, work):
    eng = FakeEngine(max_model_len=10_000, **cfg)
    pending = []
    for i, (plen, max_tokens, family, arrive_step) in enumerate(work):
        # families share prompt prefixes so the prefix cache gets hits
        prompt = [(family * 31 + j) % 50 + 3 for j in range(plen)]
        if -(-(plen + max_tokens) // cfg["block_size"]) > cfg["num_blocks"]:
            continue  # the engine rejects such a request at add_request
        pending.append((arrive_step, str(i), prompt, max_tokens))
    pending.sort()
    n = len(pending)
    while pending or eng.sched.has_unfinished_requests():
        while pending and pending[0][0] <= eng.steps:
            _, rid, prompt, max_tokens = pending.pop(0)
            eng.add(rid, prompt, max_tokens)
        if eng.sched.has_unfinished_requests():
            eng.step()
        else:
            eng.steps += 1
        assert eng.steps < 20_000
    assert len(eng.finished) == n
    assert all(r.num_output_tokens >= 1 for r in eng.finished)
    assert eng.kv.num_free_blocks == cfg["num_blocks"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(budget=st.integers(4, 64), num_blocks=st.integers(12, 40), max_num_seqs=st.integers(1, 6),
       prefix=st.booleans(), lens=st.lists(st.integers(1, 120), min_size=1, max_size=6))
def test_engine_invariants_random(random_llama, budget, num_blocks, max_num_seqs, prefix, lens):
    """The same invariants through the real engine and model (random-weight Llama)."""
    from collections import Counter

    engine = LLMEngine.from_config(model=random_llama, max_model_len=1024, max_num_batched_tokens=budget,
                                   num_kv_blocks=num_blocks, max_num_seqs=max_num_seqs,
                                   enable_prefix_caching=prefix)
    added = 0
    for i, n in enumerate(lens):
        try:
            engine.add_request(str(i), {"prompt_token_ids": [(7 * j) % 500 + 3 for j in range(n)]},
                               SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
            added += 1
        except ValueError:
            assert -(-(n + 8) // 16) > num_blocks  # rejected only when it can never fit
    finished = 0
    kv = engine.kv_cache_manager
    while engine.has_unfinished_requests():
        outs = engine.step()
        t = engine.traces[-1]
        assert t.num_scheduled_tokens <= budget and len(t.chunks) <= max_num_seqs
        holders = Counter(b for table in kv.req_to_blocks.values() for b in (x.block_id for x in table))
        for b in kv.pool.blocks:
            assert b.ref_cnt == holders.get(b.block_id, 0)
            assert not (kv.pool.is_free(b) and b.ref_cnt)
        finished += sum(o.finished for o in outs)
        assert len(engine.traces) < 5000
    assert finished == added and kv.num_free_blocks == num_blocks
