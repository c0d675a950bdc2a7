"""No livelock: every policy and preemption mode finishes every request within a step bound
computed from the workload.

The livelock: under prefill-first with recompute preemption, a request at the LAST token of its re-prefill
counted as a decode (one uncomputed token, ``num_computed_tokens >= num_prompt_tokens``), so it was scheduled
after the prefills, one of which had been admitted without reserving its next block; it preempted itself, the
other request got to its last token and the same happened to it, forever. Fixed at the cause: a resumed
request is prefilling until it has computed every token it had (``Request.prefill_len``), and an admission
ahead of running requests leaves each of them the block of its next token, in this step or the next.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from minengine.core.policies import POLICIES, PolicySettings
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams
from tests.fake_engine import FakeEngine


def run_with_bound(eng: FakeEngine, work: list[tuple[int, str, list[int], int, int]]) -> tuple[int, int]:
    """Run ``work`` ((arrival step, id, prompt, max_tokens, priority)) to the end and check progress.

    The bound, from the workload: one (re)prefill computes at most W = max(prompt + max_tokens) tokens, at one
    token or more per step. The request a policy serves first keeps its blocks (victims are picked among the
    others) and advances, so a prefill completes and samples within W steps; a policy that serves another
    request first (prefills first, a more urgent one, a fair share) may hand that role to each of the N
    requests, so no more than G = N * W steps may pass without a sampled token while requests are unfinished,
    and every request has finished after last arrival + (sum of max_tokens) * (G + 1) steps.
    Returns (steps taken, the bound)."""
    work = sorted(work)
    n = len(work)
    w = max(len(p) + m for _, _, p, m, _ in work)
    gap_bound = n * w
    bound = work[-1][0] + sum(m for *_, m, _ in work) * (gap_bound + 1)
    pending = list(work)
    gap = 0
    while pending or eng.sched.has_unfinished_requests():
        while pending and pending[0][0] <= eng.steps:
            _, rid, prompt, max_tokens, priority = pending.pop(0)
            eng.add(rid, prompt, max_tokens, priority=priority)
        if not eng.sched.has_unfinished_requests():
            eng.steps += 1  # idle until the next arrival
            continue
        out = eng.step()
        gap = 0 if any(s.sample for s in out.scheduled) else gap + 1
        assert gap <= gap_bound, f"{gap} steps without a sampled token (bound {gap_bound}): no progress"
        assert eng.steps <= bound, f"not finished after {eng.steps} steps (bound {bound})"
    assert len(eng.finished) == n
    assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks
    return eng.steps, bound


def test_prefill_first_recompute_livelock_is_gone():
    """A livelock that once happened: block_size 2, 24 blocks, long_prefill_token_threshold 1; two 40-token prompts that
    cannot both be in the pool (22 blocks each). They must not take turns re-prefilling forever."""
    eng = FakeEngine(num_blocks=24, block_size=2, budget=64, max_num_seqs=4, threshold=1, prefix=False,
                     policy="prefill-first")
    steps, bound = run_with_bound(eng, [(0, "a", [3] * 40, 4, 0), (0, "b", [4] * 40, 4, 0)])
    assert eng.sched.num_preemptions > 0  # the pool really was contended


def test_a_resumed_request_is_prefilling_until_its_last_token():
    request = Request("r", [5] * 6, SamplingParams(max_tokens=8), 0.0)
    request.output_token_ids = [7, 8, 9]
    request.num_computed_tokens = 8  # everything but the latest output: a decode
    assert request.is_decode
    request.num_computed_tokens, request.prefill_len = 8, 9  # recompute-preempted with 9 tokens, re-prefilling
    assert not request.is_decode  # its last token is still part of its prefill
    request.num_computed_tokens = 9
    request.output_token_ids.append(10)  # the re-prefill sampled: now it decodes
    assert request.is_decode


def test_recompute_preemption_sets_the_prefill_length():
    eng = FakeEngine(num_blocks=4, block_size=4, budget=64, prefix=False)
    eng.add("a", [1] * 8, max_tokens=8)
    b = eng.add("b", [2] * 8, max_tokens=8)
    eng.step()
    out = eng.step()  # a needs its 3rd block: b (the latest admitted) is preempted by recompute
    assert out.preempted_ids == ["b"] and b.status is RequestStatus.PREEMPTED
    assert b.prefill_len == b.num_tokens == 9 and not b.is_decode


@pytest.mark.parametrize("policy", ["prefill-first", "balanced"])
def test_admission_leaves_running_prefills_their_next_block(policy):
    """a (7-token prompt, chunks of 4) holds 1 of 2 blocks and needs the other next step; b must not take it
    (it would be preempted at once, or a would preempt itself)."""
    eng = FakeEngine(num_blocks=2, block_size=4, budget=64, max_num_seqs=4, threshold=4, prefix=False, policy=policy)
    eng.add("a", [3] * 7, max_tokens=1)
    eng.add("b", [4] * 3, max_tokens=2)
    out = eng.step()
    assert out.admitted_ids == ["a"]
    eng.run()
    assert eng.sched.num_preemptions == 0 and len(eng.finished) == 2


MODES = ["recompute", "swap"]
# (prompt length, max_tokens, arrival step, priority); pools are sized near the largest request's need
workloads = st.lists(st.tuples(st.integers(1, 48), st.integers(1, 16), st.integers(0, 4), st.integers(0, 3)),
                     min_size=2, max_size=6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=workloads, block_size=st.sampled_from([1, 2, 4, 8, 16, 32]), slack=st.sampled_from([0, 0, 1, 2, 4, 16]),
       budget=st.integers(1, 64), threshold=st.sampled_from([0, 1, 1, 2, 3, 8]), max_num_seqs=st.integers(1, 8),
       chunked=st.sampled_from([True, True, True, False]), prefix=st.booleans(), shrink=st.booleans(),
       swap_blocks=st.integers(0, 64), aging=st.integers(0, 8), target=st.integers(1, 64))
@example(work=[(40, 4, 0, 0), (40, 4, 0, 0)], block_size=2, slack=2, budget=64, threshold=1, max_num_seqs=4,
         chunked=True, prefix=False, shrink=False, swap_blocks=0, aging=0, target=64)
def test_every_policy_finishes_within_the_bound(policy, mode, work, block_size, slack, budget, threshold,
                                                 max_num_seqs, chunked, prefix, shrink, swap_blocks, aging, target):
    max_model_len = 10_000 if chunked else budget
    work = [(arrive, str(i), [(i * 7 + j) % 11 + 3 for j in range(plen)], max_tokens, prio)
            for i, (plen, max_tokens, arrive, prio) in enumerate(work) if plen + max_tokens <= max_model_len]
    if not work:
        return
    need = max(-(-(len(p) + m) // block_size) for _, _, p, m, _ in work)
    settings_ = PolicySettings(splitfuse_target_tokens=min(target, budget), priority_aging_steps=aging)
    eng = FakeEngine(num_blocks=need + slack, block_size=block_size, budget=budget, max_num_seqs=max_num_seqs,
                     max_model_len=max_model_len, chunked=chunked, threshold=threshold if chunked else 0,
                     prefix=prefix, policy=policy, settings=settings_, preemption_mode=mode,
                     swap_blocks=swap_blocks, shrink=shrink)
    run_with_bound(eng, work)
