"""Scheduling policies, swap preemption, the admission probe and deadlines.

Model-free (fast): every policy keeps the invariants on random workloads (hypothesis), and each policy's
intended effect shows as an ORDERING of step counts on a fixed workload (never a timing).
With a model (random-weight Llama, and the bundled model): greedy outputs equal transformers' whatever the
policy or preemption mode; swap really swaps; deadlines finish requests with "timeout".
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from minengine import LLM, EngineConfig, LLMEngine, SamplingParams
from minengine.core.policies import POLICIES, PolicySettings
from minengine.request import RequestStatus
from tests.conftest import drain, hf_greedy
from tests.fake_engine import FakeEngine, StepClock

# ---- invariants on random workloads, every policy and preemption mode ------------------------------------

configs = st.fixed_dictionaries({
    "num_blocks": st.integers(8, 48),
    "block_size": st.sampled_from([1, 2, 4, 16]),
    "budget": st.integers(1, 96),
    "max_num_seqs": st.integers(1, 8),
    "threshold": st.integers(0, 24),
    "prefix": st.booleans(),
    "chunked": st.booleans(),
    "preemption_mode": st.sampled_from(["recompute", "swap"]),
    "swap_blocks": st.integers(0, 48),
    "shrink": st.booleans(),
})
knobs = st.builds(PolicySettings, prefill_decode_ratio=st.sampled_from([0.25, 1.0, 3.0]),
                  splitfuse_target_tokens=st.one_of(st.none(), st.integers(1, 96)),
                  priority_aging_steps=st.integers(0, 8))
# (prompt length, max_tokens, prefix family, arrival step, priority, abort step or -1)
workloads = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12), st.integers(0, 3), st.integers(0, 6),
                               st.integers(0, 3), st.sampled_from([-1, -1, -1, 2, 5, 9])), min_size=1, max_size=10)


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, knob=knobs, work=workloads)
@example(  # found by hypothesis: prefill-first's admissions took a decode's block; two requests took turns
    cfg=dict(num_blocks=8, block_size=4, budget=25, max_num_seqs=4, threshold=22, prefix=False, chunked=True,
             preemption_mode="recompute", swap_blocks=0, shrink=True),
    knob=PolicySettings(prefill_decode_ratio=0.25, splitfuse_target_tokens=None, priority_aging_steps=0),
    work=[(21, 10, 0, 0, 0, -1), (59, 6, 0, 3, 3, -1), (17, 5, 1, 6, 0, -1), (29, 11, 1, 3, 0, 2),
          (4, 12, 3, 0, 1, -1)])
def test_policy_invariants_random(policy, cfg, knob, work):
    """After every step: token budget, max_num_seqs, ref counts == holders, no block free and held, swap
    blocks held once, the cache holds every scheduled request's tokens. At the end: all finished, all free."""
    if knob.splitfuse_target_tokens is not None:
        knob = PolicySettings(knob.prefill_decode_ratio, min(knob.splitfuse_target_tokens, cfg["budget"]),
                              knob.priority_aging_steps)
    max_model_len = 10_000 if cfg["chunked"] else cfg["budget"]
    eng = FakeEngine(max_model_len=max_model_len, policy=policy, settings=knob, **cfg)
    pending, aborts = [], {}
    for i, (plen, max_tokens, family, arrive, priority, abort_step) in enumerate(work):
        prompt = [(family * 31 + j) % 50 + 3 for j in range(plen)]
        if -(-(plen + max_tokens) // cfg["block_size"]) > cfg["num_blocks"] or plen + max_tokens > max_model_len:
            continue  # the engine rejects such a request at add_request
        pending.append((arrive, str(i), prompt, max_tokens, priority))
        if abort_step >= 0:
            aborts.setdefault(arrive + abort_step, []).append(str(i))
    pending.sort()
    n = len(pending)
    aborted = 0
    while pending or eng.sched.has_unfinished_requests():
        while pending and pending[0][0] <= eng.steps:
            _, rid, prompt, max_tokens, priority = pending.pop(0)
            eng.add(rid, prompt, max_tokens, priority=priority)
        aborted += len(eng.sched.finish_requests(aborts.pop(eng.steps, []), RequestStatus.FINISHED_ABORTED))
        eng.check_invariants()
        if eng.sched.has_unfinished_requests():
            out = eng.step()
            assert out.scheduled, "a step scheduled nothing although requests are unfinished"
        else:
            eng.steps += 1
        assert eng.steps < 20_000, "no progress: requests keep preempting each other"
    assert len(eng.finished) + aborted == n
    assert all(r.num_output_tokens >= 1 for r in eng.finished)
    assert eng.kv.num_free_blocks == cfg["num_blocks"]
    if cfg["preemption_mode"] == "swap":
        eng.sched.swap_space.begin_step()
        assert eng.sched.swap_space.num_free_blocks == eng.sched.swap_space.num_blocks
    if cfg["preemption_mode"] == "recompute":
        assert eng.sched.num_swapped_out_blocks == 0
    assert eng.sched.num_swapped_in_blocks <= eng.sched.num_swapped_out_blocks


# ---- each policy's intended effect, as an ordering on a fixed workload -----------------------------------

def longest_decode_stall(eng: FakeEngine) -> int:
    """The most steps any request went without a token between two of its tokens."""
    return max((b - a - 1 for steps in eng.token_steps.values() for a, b in zip(steps, steps[1:])), default=0)


def run_stall_workload(policy: str) -> FakeEngine:
    """Four short requests decode while long prompts keep arriving."""
    eng = FakeEngine(num_blocks=256, block_size=4, budget=32, max_num_seqs=16, policy=policy)
    for i in range(4):
        eng.add(f"short{i}", [i + 3] * 4, max_tokens=40)
    for step in range(40):
        if step % 4 == 2:
            eng.add(f"long{step}", [step + 5] * 96, max_tokens=2)
        eng.step()
    eng.run()
    return eng


def test_decode_first_stalls_decodes_less_than_prefill_first():
    decode_first, prefill_first = run_stall_workload("decode-first"), run_stall_workload("prefill-first")
    assert longest_decode_stall(decode_first) == 0  # a running decode is never skipped
    assert longest_decode_stall(decode_first) < longest_decode_stall(prefill_first)


def ttft_steps(eng: FakeEngine, rid: str) -> int:
    return eng.token_steps[rid][0] - eng.arrival[rid]


def run_priority_workload(policy: str, aging: int = 64) -> FakeEngine:
    """Eight background requests queue first (priority 1); an urgent one (priority 0) arrives last."""
    eng = FakeEngine(num_blocks=128, block_size=4, budget=16, max_num_seqs=2, policy=policy,
                     settings=PolicySettings(priority_aging_steps=aging))
    for i in range(8):
        eng.add(f"bg{i}", [i + 3] * 12, max_tokens=6, priority=1)
    eng.step()
    eng.add("urgent", [99] * 12, max_tokens=6, priority=0)
    eng.run()
    return eng


def test_priority_lowers_high_priority_ttft():
    fcfs, prio = run_priority_workload("decode-first"), run_priority_workload("priority")
    assert ttft_steps(prio, "urgent") < ttft_steps(fcfs, "urgent")
    assert {r.request_id for r in prio.finished} == {r.request_id for r in fcfs.finished}


def test_priority_victim_is_the_least_urgent_running_request():
    # 7 blocks of 4. c (least urgent) runs first; then a and b arrive and take the other blocks.
    eng = FakeEngine(num_blocks=7, block_size=4, budget=64, prefix=False, policy="priority")
    eng.add("c", [3] * 8, max_tokens=20, priority=2)
    eng.step()
    eng.add("b", [2] * 8, max_tokens=20, priority=1)
    eng.add("a", [1] * 8, max_tokens=20, priority=0)
    eng.step()  # c decodes into its 3rd block, a and b prefill 2 blocks each: the pool is full
    assert [r.request_id for r in eng.sched.running] == ["c", "a", "b"]
    out = eng.step()  # a needs a block: the victim is c, not b (the most recently admitted)
    assert out.preempted_ids == ["c"]
    assert [s.request_id for s in out.scheduled] == ["a", "b"]
    eng.run()
    assert len(eng.finished) == 3


def run_starvation_workload(aging: int) -> FakeEngine:
    """A low-priority request waits while urgent requests keep arriving for 60 steps; one sequence slot."""
    eng = FakeEngine(num_blocks=64, block_size=4, budget=16, max_num_seqs=1, policy="priority",
                     settings=PolicySettings(priority_aging_steps=aging))
    eng.add("low", [7] * 8, max_tokens=2, priority=5)
    for step in range(60):
        eng.add(f"hi{step}", [step % 40 + 3] * 8, max_tokens=2, priority=0)
        eng.step()
    eng.run()
    return eng


def test_priority_aging_prevents_starvation():
    starved, aged = run_starvation_workload(aging=0), run_starvation_workload(aging=4)
    assert ttft_steps(aged, "low") < ttft_steps(starved, "low")
    assert ttft_steps(starved, "low") >= 60  # without aging it waits for the whole urgent stream


def tokens_per_step_while_prefill_pending(eng: FakeEngine) -> list[int]:
    """Tokens of the steps that cut a prompt into a chunk, i.e. had more prefill work than they took."""
    return [out.num_scheduled_tokens for out in eng.outputs
            if any(s.is_prefill and not s.sample for s in out.scheduled)]


def run_splitfuse_workload(policy: str, target: int | None = None) -> FakeEngine:
    """Twelve prompts of 24..112 tokens at once: decodes pile up as their prefills complete."""
    eng = FakeEngine(num_blocks=512, block_size=4, budget=64, max_num_seqs=12, policy=policy,
                     settings=PolicySettings(splitfuse_target_tokens=target))
    for i in range(12):
        eng.add(f"r{i}", [i + 3] * (24 + 8 * i), max_tokens=12)
    eng.run()
    return eng


def test_splitfuse_keeps_tokens_per_step_near_target():
    target = 40
    fuse, decode_first = run_splitfuse_workload("dynamic-splitfuse", target), run_splitfuse_workload("decode-first")
    fused = tokens_per_step_while_prefill_pending(fuse)
    assert len(fused) > 10 and all(target - 4 <= n <= target for n in fused)

    def spread(xs):
        return sum(abs(x - target) for x in xs) / len(xs)

    assert spread(fused) < spread(tokens_per_step_while_prefill_pending(decode_first))


def test_splitfuse_gives_prefill_fewer_tokens_when_more_decodes_run():
    fuse = run_splitfuse_workload("dynamic-splitfuse", 40)
    mixed = [out for out in fuse.outputs if any(s.is_prefill for s in out.scheduled)
             and any(not s.is_prefill for s in out.scheduled)]
    pairs = [(sum(not s.is_prefill for s in o.scheduled), sum(s.num_new_tokens for s in o.scheduled if s.is_prefill))
             for o in mixed if o.num_scheduled_tokens == 40]
    assert len({d for d, _ in pairs}) > 1
    assert all(d1 + p1 == d2 + p2 for (d1, p1), (d2, p2) in zip(pairs, pairs[1:]))


def test_balanced_guarantees_the_prefill_share():
    def min_prefill_tokens(policy):
        eng = FakeEngine(num_blocks=512, block_size=4, budget=32, max_num_seqs=40, policy=policy,
                         settings=PolicySettings(prefill_decode_ratio=1.0))
        for i in range(28):
            eng.add(f"d{i}", [i + 3] * 2, max_tokens=60)
        for _ in range(4):  # now all 28 are decoding: decode-first leaves 4 tokens of 32 for prefill
            eng.step()
        eng.add("long", [5] * 200, max_tokens=1)
        eng.run()
        steps = [o for o in eng.outputs if any(s.request_id == "long" for s in o.scheduled)]
        return min(s.num_new_tokens for o in steps[:-1] for s in o.scheduled if s.request_id == "long")

    assert min_prefill_tokens("balanced") == 16  # half the budget while its prompt is unfinished
    assert min_prefill_tokens("balanced") > min_prefill_tokens("decode-first")


# ---- no running decode starves under a policy that shares the budget with decodes --------------------------

def decode_turn_bound(policy: str, knob: PolicySettings, budget: int, max_num_seqs: int, num_spec: int) -> int:
    """K: the most consecutive steps a running decode may go unscheduled under ``policy``.

    The policies that give decodes a share before any prefill work: balanced (``Balanced.decode_share`` tokens),
    dynamic-splitfuse and round-robin (all decodes first: the whole budget). A share of S tokens serves at least
    m = max(1, S // (1 + num_spec)) decodes (each takes 1 token, plus up to ``num_spec`` proposals), least
    recently scheduled first; of at most ``max_num_seqs`` decodes, one waits at most ceil(max_num_seqs / m) - 1
    steps. (decode-first, priority and shortest-predicted-first serve running requests in their order, an
    unfinished prefill chunk included, and prefill-first gives decodes only what is left: no such claim.)
    """
    share = POLICIES["balanced"](knob).decode_share(budget) if policy == "balanced" else budget
    served = max(1, share // (1 + num_spec))
    return -(-max_num_seqs // served) - 1


SHARING_POLICIES = ("balanced", "dynamic-splitfuse", "round-robin")


@pytest.mark.parametrize("policy", SHARING_POLICIES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, knob=knobs, work=workloads, num_spec=st.sampled_from([0, 0, 1, 3]))
@example(  # chapter 04's shape, small: more decodes than the decode share while a long prompt is chunked
    cfg=dict(num_blocks=48, block_size=4, budget=8, max_num_seqs=8, threshold=0, prefix=False, chunked=True,
             preemption_mode="recompute", swap_blocks=0, shrink=False),
    knob=PolicySettings(prefill_decode_ratio=3.0), num_spec=0,
    work=[(2, 12, 0, 0, 0, -1)] * 6 + [(60, 2, 1, 2, 0, -1)])
@example(  # proposals: the first decodes could take the whole budget every step
    cfg=dict(num_blocks=64, block_size=4, budget=4, max_num_seqs=4, threshold=0, prefix=False, chunked=True,
             preemption_mode="recompute", swap_blocks=0, shrink=False),
    knob=PolicySettings(), num_spec=3, work=[(1, 40, 0, 0, 0, -1)] * 4)
def test_no_running_decode_starves(policy, cfg, knob, work, num_spec):
    """Random engines and workloads (aborts, preemption, swap, speculative decoding): no request that is a
    running decode at the start of a step goes more than ``decode_turn_bound`` steps in a row unscheduled while
    it stays running."""
    if knob.splitfuse_target_tokens is not None:
        knob = PolicySettings(knob.prefill_decode_ratio, min(knob.splitfuse_target_tokens, cfg["budget"]),
                              knob.priority_aging_steps)
    max_model_len = 10_000 if cfg["chunked"] else cfg["budget"]
    spec = {"method": "ngram", "num_speculative_tokens": num_spec, "prompt_lookup_min": 1,
            "prompt_lookup_max": 2} if num_spec else None
    eng = FakeEngine(max_model_len=max_model_len, policy=policy, settings=knob, speculative_config=spec,
                     content_sampling="markov" if spec else False, **cfg)
    bound = decode_turn_bound(policy, knob, cfg["budget"], cfg["max_num_seqs"], num_spec)
    pending, aborts = [], {}
    for i, (plen, max_tokens, family, arrive, priority, abort_step) in enumerate(work):
        prompt = [(family * 31 + j) % 50 + 3 for j in range(plen)]
        if -(-(plen + max_tokens) // cfg["block_size"]) > cfg["num_blocks"] or plen + max_tokens > max_model_len:
            continue
        pending.append((arrive, str(i), prompt, max_tokens, priority))
        if abort_step >= 0:
            aborts.setdefault(arrive + abort_step, []).append(str(i))
    pending.sort()
    unserved: dict[str, int] = {}  # running decode -> consecutive steps it was not scheduled
    while pending or eng.sched.has_unfinished_requests():
        while pending and pending[0][0] <= eng.steps:
            _, rid, prompt, max_tokens, priority = pending.pop(0)
            eng.add(rid, prompt, max_tokens, priority=priority)
        eng.sched.finish_requests(aborts.pop(eng.steps, []), RequestStatus.FINISHED_ABORTED)
        if not eng.sched.has_unfinished_requests():
            eng.steps += 1
            continue
        decodes = [r for r in eng.sched.running if r.is_decode]
        out = eng.step()
        scheduled = {s.request_id for s in out.scheduled}
        unserved = {r.request_id: unserved.get(r.request_id, 0) + 1 for r in decodes
                    if r.request_id not in scheduled and r.status is RequestStatus.RUNNING}
        worst = max(unserved.values(), default=0)
        assert worst <= bound, f"{policy}: a running decode went {worst} steps unscheduled (bound {bound})"
        assert eng.steps < 20_000


def longest_wait(eng: FakeEngine, rid: str) -> int:
    """The longest run of steps in which ``rid`` waited for its prompt's next chunk (from arrival on)."""
    served = [i for i, out in enumerate(eng.outputs) if any(s.request_id == rid and s.is_prefill
                                                              for s in out.scheduled)]
    marks = [eng.arrival[rid] - 1] + served
    return max(b - a - 1 for a, b in zip(marks, marks[1:]))


def run_two_long_prompts(policy: str) -> FakeEngine:
    eng = FakeEngine(num_blocks=256, block_size=4, budget=16, max_num_seqs=4, policy=policy)
    eng.add("first", [3] * 160, max_tokens=2)
    eng.step()
    eng.add("second", [4] * 160, max_tokens=2)
    eng.run()
    return eng


def test_round_robin_reduces_head_of_line_blocking():
    fifo, rr = run_two_long_prompts("decode-first"), run_two_long_prompts("round-robin")
    assert longest_wait(rr, "second") <= 1
    assert longest_wait(rr, "second") < longest_wait(fifo, "second")


def run_memory_pressure(mode: str, swap_blocks: int, policy: str = "decode-first") -> FakeEngine:
    eng = FakeEngine(num_blocks=12, block_size=4, budget=64, max_num_seqs=4, prefix=False, policy=policy,
                     preemption_mode=mode, swap_blocks=swap_blocks)
    for i in range(4):
        eng.add(f"r{i}", [i + 3] * 10, max_tokens=14)
    eng.run()
    return eng


def test_swap_preemption_keeps_computed_tokens():
    recompute, swap = run_memory_pressure("recompute", 0), run_memory_pressure("swap", 12)
    assert swap.sched.num_preemptions > 0 and swap.sched.num_swapped_out_blocks > 0
    assert swap.sched.num_swapped_in_blocks == swap.sched.num_swapped_out_blocks
    computed = [sum(o.num_scheduled_tokens for o in e.outputs) for e in (recompute, swap)]
    assert computed[1] < computed[0]  # nothing is recomputed after a swap
    tokens = [{r.request_id: r.output_token_ids for r in e.finished} for e in (recompute, swap)]
    assert tokens[0] == tokens[1]


def test_swap_falls_back_to_recompute_when_swap_space_is_full():
    eng = run_memory_pressure("swap", 1)  # one CPU block: no victim fits
    assert eng.sched.num_preemptions > 0 and eng.sched.num_swapped_out_blocks == 0
    assert len(eng.finished) == 4


def blocked_admission(shrink: bool):
    """6 of 8 blocks held by a running request; a 20-token prompt (5 blocks) arrives."""
    eng = FakeEngine(num_blocks=8, block_size=4, budget=64, prefix=False, shrink=shrink)
    eng.add("a", [1] * 24, max_tokens=4)
    eng.step()
    eng.add("b", [2] * 20, max_tokens=2)
    out = eng.step()
    return eng, out


def test_admission_probe_shrinks_chunk_to_what_fits():
    plain_eng, plain = blocked_admission(shrink=False)
    probe_eng, probe = blocked_admission(shrink=True)
    assert "b" not in plain.admitted_ids
    assert probe.admitted_ids == ["b"]
    (b,) = [s for s in probe.scheduled if s.request_id == "b"]
    assert b.num_new_tokens == 4 and not b.sample  # one block: all that was free after a's decode block
    for eng in (plain_eng, probe_eng):
        eng.run()
        assert len(eng.finished) == 2 and eng.kv.num_free_blocks == 8


# ---- config validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(scheduling_policy="lifo"), "scheduling_policy"), (dict(preemption_mode="drop"), "preemption_mode"),
    (dict(swap_space_blocks=-1), "swap_space_blocks"), (dict(prefill_decode_ratio=0), "prefill_decode_ratio"),
    (dict(splitfuse_target_tokens=0), "splitfuse_target_tokens"),
    (dict(splitfuse_target_tokens=4096, max_num_batched_tokens=2048), "splitfuse_target_tokens"),
    (dict(priority_aging_steps=-1), "priority_aging_steps"), (dict(shrink_prefill_chunks=1), "shrink_prefill_chunks"),
])
def test_bad_scheduling_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


# ---- with a model: greedy outputs identical whatever the policy or preemption mode -------------------------

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def model_prompts(stream: list[int]) -> list[list[int]]:
    """Ten prompts of 3..70 tokens, two pairs sharing a prefix."""
    lens = [3, 70, 17, 40, 9, 33, 55, 21, 64, 12]
    prompts = [stream[i * 70:i * 70 + n] for i, n in enumerate(lens)]
    prompts[8] = prompts[1][:40] + prompts[8][:24]
    prompts[9] = prompts[3][:32] + prompts[9]
    return prompts


SMALL_POOL = dict(max_model_len=256, block_size=8, num_kv_blocks=24, max_num_batched_tokens=32, max_num_seqs=6)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_greedy_outputs_identical_across_policies(random_llama, random_prompts, policy, mode):
    prompts = model_prompts(random_prompts[-1] + random_prompts[-2])
    llm = LLM(random_llama, scheduling_policy=policy, preemption_mode=mode, splitfuse_target_tokens=24,
              shrink_prefill_chunks=mode == "swap", **SMALL_POOL)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(random_llama, tuple(prompt), 10), f"{len(prompt)} tokens"
    engine = llm.llm_engine
    summary = engine.summary()
    assert summary.num_preemptions > 0  # the small pool really preempted
    if mode == "swap":
        assert summary.num_swapped_out_blocks > 0 and summary.num_swapped_in_blocks > 0
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_swap_matches_unpreempted_run_on_bundled_model(bundled_model, bundled_prompts):
    prompts = [p[:60] for p in bundled_prompts if len(p) >= 20][:8]
    roomy = LLM(bundled_model, max_model_len=512, max_num_batched_tokens=64)
    reference = roomy.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert roomy.llm_engine.summary().num_preemptions == 0
    swap = LLM(bundled_model, max_model_len=512, max_num_batched_tokens=64, num_kv_blocks=16, block_size=8,
               preemption_mode="swap", scheduling_policy="priority")
    outs = swap.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    summary = swap.llm_engine.summary()
    assert summary.num_swapped_out_blocks > 0 and summary.num_swapped_in_blocks > 0 and summary.swap_time_s > 0
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in reference]


# ---- priority argument and deadlines through the engine ---------------------------------------------------

def test_deadline_finishes_with_timeout_and_frees_blocks(random_llama):
    clock = StepClock()
    engine = LLMEngine(EngineConfig(model=random_llama, max_model_len=256, num_kv_blocks=32, block_size=8,
                                    max_num_batched_tokens=16), clock=clock)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("late", {"prompt_token_ids": list(range(3, 40))}, params, deadline=12.0)
    engine.add_request("free", {"prompt_token_ids": list(range(5, 20))}, params, priority=3)
    final = drain(engine)
    assert final["late"].outputs[0].finish_reason == "timeout"
    assert final["late"].metrics.finished_time >= 12.0
    assert 0 < len(final["late"].outputs[0].token_ids) < 30
    assert final["free"].outputs[0].finish_reason == "length" and len(final["free"].outputs[0].token_ids) == 30
    assert engine.kv_cache_manager.num_free_blocks == 32
    assert engine.summary().num_timeouts == 1
    # A deadline already past: it finishes at the next step without being scheduled.
    engine.add_request("expired", [3, 4, 5], params, deadline=clock.now)
    num_steps = len(engine.traces)
    (out,) = engine.step()
    assert out.finished and out.outputs[0].finish_reason == "timeout" and out.outputs[0].token_ids == []
    assert len(engine.traces) == num_steps and not engine.has_unfinished_requests()
    assert engine.summary().num_timeouts == 2


def test_bad_priority_or_deadline_is_rejected(random_llama):
    engine = LLMEngine.from_config(model=random_llama, max_model_len=64, num_kv_blocks=8)
    with pytest.raises(ValueError, match="priority"):
        engine.add_request("a", [3, 4], GREEDY, priority=1.5)
    with pytest.raises(ValueError, match="deadline"):
        engine.add_request("a", [3, 4], GREEDY, deadline="soon")
