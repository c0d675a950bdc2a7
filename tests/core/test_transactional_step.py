"""A step is a transaction: a block is findable in the prefix cache only once its K/V has
really been written, and a step that raises after ``schedule()`` (in the model forward, the sampler or the
detokenizer, or Ctrl-C) is rolled back, so the engine keeps serving later requests correctly.

Checked directly: ``KVShadow`` recomputes what every KV slot holds from the steps that really ran (a failed
step leaves garbage in every slot it would have written), and after every step no indexed block and no
request's computed tokens point at anything else. And end to end: greedy outputs equal transformers'.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLM, LLMEngine, SamplingParams
from minengine.core.policies import POLICIES
from minengine.engine.detokenizer import IncrementalDetokenizer
from minengine.exceptions import RequestError
from minengine.request import RequestStatus
from tests.conftest import hf_greedy
from tests.fake_engine import FakeEngine
from tests.kv_shadow import check_scheduler, watch_runner


class InjectedFault(RuntimeError):
    """The exception the tests inject."""


# ---- model-free: the scheduler's rollback, on random workloads and random failing steps -------------------

def snapshot(sched):
    """Every request's scheduling state, and the queues."""
    state = {rid: (r.status, r.num_computed_tokens, tuple(sched.kv.get_block_ids(rid)), tuple(r.swapped_block_ids),
                   r.num_cached_tokens) for rid, r in sched.requests.items()}
    return state, [r.request_id for r in sched.waiting], [r.request_id for r in sched.running]


def run_alone(prompt, max_tokens, block_size):
    eng = FakeEngine(num_blocks=256, block_size=block_size, budget=512, max_model_len=10_000, content_sampling=True)
    eng.add("x", prompt, max_tokens)
    eng.run()
    return eng.finished[0].output_token_ids


configs = st.fixed_dictionaries({
    "num_blocks": st.integers(4, 48), "block_size": st.sampled_from([1, 2, 4, 8]), "budget": st.integers(1, 64),
    "max_num_seqs": st.integers(1, 6), "threshold": st.sampled_from([0, 0, 1, 3, 8]), "prefix": st.booleans(),
    "chunked": st.booleans(), "policy": st.sampled_from(list(POLICIES)),
    "preemption_mode": st.sampled_from(["recompute", "swap"]), "swap_blocks": st.integers(0, 48),
})
# (prompt length, max_tokens, prefix family): requests of one family share a prompt prefix
workloads = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 10), st.integers(0, 2)), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, work=workloads, fail_every=st.integers(2, 5), seed=st.integers(0, 10**6))
def test_failed_steps_roll_back_random(cfg, work, fail_every, seed):
    """Random steps fail after their forward started (every slot they would write is garbage): the step is
    undone exactly (all but its preemptions), no indexed block holds unwritten K/V, and every request still
    produces the tokens it produces alone."""
    import random

    rng = random.Random(seed)
    max_model_len = 10_000 if cfg["chunked"] else cfg["budget"]
    if not cfg["chunked"]:
        cfg = dict(cfg, threshold=0)
    eng = FakeEngine(max_model_len=max_model_len, content_sampling=True, **cfg)
    wanted = {}
    for i, (plen, max_tokens, family) in enumerate(work):
        prompt = [(family * 31 + j) % 50 + 3 for j in range(plen)]
        if -(-(plen + max_tokens) // cfg["block_size"]) > cfg["num_blocks"] or plen + max_tokens > max_model_len:
            continue
        eng.add(str(i), prompt, max_tokens)
        wanted[str(i)] = run_alone(prompt, max_tokens, cfg["block_size"])
    failures = 0
    while eng.sched.has_unfinished_requests():
        if rng.randrange(fail_every) == 0 and failures < 50:
            before, waiting, running = snapshot(eng.sched)
            out = eng.step(fail=True)  # checks the books and the cache after the rollback
            failures += 1
            after, waiting_after, running_after = snapshot(eng.sched)
            preempted = set(out.preempted_ids)
            assert {k: v for k, v in after.items() if k not in preempted} == \
                   {k: v for k, v in before.items() if k not in preempted}
            assert waiting_after == [r for r in waiting_after if r in preempted] + waiting
            assert running_after == [r for r in running if r not in preempted]
            assert all(after[r][0] is RequestStatus.PREEMPTED and after[r][1] == 0 for r in preempted)
        else:
            eng.step()
        assert eng.steps + failures < 20_000
    assert {r.request_id: r.output_token_ids for r in eng.finished} == wanted
    assert eng.kv.num_free_blocks == cfg["num_blocks"]


def test_same_step_prefix_hit_is_rolled_back_with_the_step():
    """b hits blocks a writes in the same step (K/V is written before attention reads it); if the step fails,
    both are rolled back and neither a's nor b's blocks are indexed."""
    eng = FakeEngine(num_blocks=32, block_size=4, budget=64)
    eng.add("a", list(range(3, 20)), max_tokens=2)
    eng.add("b", list(range(3, 20)), max_tokens=2)
    out = eng.step(fail=True)
    assert out.prefix_hit_tokens == 16  # b hit a's 4 staged blocks within the step
    assert not eng.kv.pool._cached and eng.kv.num_free_blocks == 32
    assert [r.request_id for r in eng.sched.waiting] == ["a", "b"]
    out = eng.step()  # served again, for real this time
    assert out.prefix_hit_tokens == 16 and len(eng.kv.pool._cached) == 4
    eng.run()
    assert len(eng.finished) == 2


def test_rollback_only_the_open_step():
    eng = FakeEngine()
    eng.add("a", [3, 4, 5], max_tokens=2)
    out = eng.step()
    with pytest.raises(ValueError, match="rollback"):
        eng.sched.rollback(out)  # already committed


# ---- the real engine: exceptions in the forward, the sampler and the detokenizer --------------------------

class Faults:
    """Raises ``InjectedFault`` (or KeyboardInterrupt) on chosen calls of whatever it wraps."""

    def __init__(self, fail_calls: set[int], exc=InjectedFault):
        self.fail_calls, self.exc, self.calls = set(fail_calls), exc, 0

    def hit(self):
        self.calls += 1
        if self.calls in self.fail_calls:
            raise self.exc(f"injected fault at call {self.calls}")


def inject(engine, monkeypatch, where: str, faults: Faults) -> None:
    """Make ``where`` ("forward", "sampler" or "detokenizer") raise on the chosen calls."""
    if where == "forward":  # the last decoder layer: the layers before it have already written their K/V
        layer = engine.model.model.layers[-1]
        forward = layer.forward

        def failing_forward(*args, **kwargs):
            faults.hit()
            return forward(*args, **kwargs)

        monkeypatch.setattr(layer, "forward", failing_forward)
    elif where == "sampler":
        sampler = engine.runner.sampler

        class FailingSampler:
            def __call__(self, logits, requests):
                faults.hit()
                return sampler(logits, requests)

            def __getattr__(self, name):  # what the runner reads after sampling (e.g. logprobs)
                return getattr(sampler, name)

        monkeypatch.setattr(engine.runner, "sampler", FailingSampler())
    else:  # the detokenizer's per-token method ("update" before the transactional step)
        name = "advanced" if hasattr(IncrementalDetokenizer, "advanced") else "update"
        per_token = getattr(IncrementalDetokenizer, name)

        def failing_per_token(self, *args):
            faults.hit()
            return per_token(self, *args)

        monkeypatch.setattr(IncrementalDetokenizer, name, failing_per_token)


GREEDY = dict(temperature=0, ignore_eos=True)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(["forward", "sampler", "detokenizer"]), policy=st.sampled_from(list(POLICIES)),
       mode=st.sampled_from(["recompute", "swap"]), block_size=st.sampled_from([2, 4, 8, 16]),
       budget=st.integers(8, 64), lens=st.lists(st.tuples(st.integers(1, 70), st.integers(0, 2)), min_size=2,
                                                max_size=6),
       fail_calls=st.sets(st.integers(1, 40), min_size=1, max_size=6), abort=st.booleans())
def test_engine_survives_faults_random(bundled_model, bundled_prompts, monkeypatch, where, policy, mode, block_size,
                                       budget, lens, fail_calls, abort):
    """Faults at random steps of random workloads: after each, the engine either goes on (the same requests
    are retried) or the caller aborts what was in flight; every output equals transformers' greedy output,
    later identical prompts too; the KV shadow holds after every step; every block is free at the end."""
    base = bundled_prompts[-1]
    num_blocks = max(-(-(70 + 80 + 10) // block_size), 12)
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=256, block_size=block_size,
                                   num_kv_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=4,
                                   scheduling_policy=policy, preemption_mode=mode)
    shadow = watch_runner(engine)
    faults = Faults(fail_calls)
    with monkeypatch.context() as m:
        inject(engine, m, where, faults)
        prompts = {}
        for i, (n, family) in enumerate(lens):
            prompts[str(i)] = base[family * 80: family * 80 + 80][:n]  # families share prefixes
            engine.add_request(str(i), {"prompt_token_ids": prompts[str(i)]}, SamplingParams(max_tokens=8, **GREEDY))
        final, aborted, num_faults = {}, set(), 0
        while engine.has_unfinished_requests():
            try:
                outs = engine.step()
            except (InjectedFault, RequestError) as exc:  # a detokenizer's fault names its request
                assert isinstance(exc, InjectedFault) or isinstance(exc.__cause__, InjectedFault)
                num_faults += 1
                check_scheduler(engine.scheduler)
                shadow.check(engine.scheduler)
                if abort:  # what LLM.generate does: abort everything in flight
                    ids = list(engine.scheduler.requests)
                    engine.abort_request(ids)
                    aborted.update(ids)
                continue
            check_scheduler(engine.scheduler)
            shadow.check(engine.scheduler)
            final.update({o.request_id: o for o in outs if o.finished})
            assert len(engine.traces) < 3000
    assert num_faults == sum(c <= faults.calls for c in fail_calls)  # every injected fault reached the caller
    # after the faults: the same prompts again (they may hit what the first round left in the cache)
    for rid, p in list(prompts.items()):
        engine.add_request("again-" + rid, {"prompt_token_ids": p}, SamplingParams(max_tokens=8, **GREEDY))
        prompts["again-" + rid] = p
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
        shadow.check(engine.scheduler)
    for rid, out in final.items():
        if rid not in aborted:
            assert out.outputs[0].token_ids == hf_greedy(bundled_model, tuple(prompts[rid]), 8), rid
    assert set(final) | aborted == set(prompts)
    assert engine.kv_cache_manager.num_free_blocks == num_blocks


def test_interrupted_generate_does_not_poison_the_prefix_cache(bundled_model, bundled_prompts, monkeypatch):
    """Ctrl-C during LLM.generate's first forward, then the same prompt again: the second run must not "hit" the
    first run's K/V, never written (as it would if blocks were indexed when allocated)."""
    prompt = bundled_prompts[-1][:200]  # 12 full blocks of 16
    llm = LLM(bundled_model, max_model_len=512)
    engine = llm.llm_engine
    with monkeypatch.context() as m:
        inject(engine, m, "forward", Faults({1}, exc=KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
    assert not engine.has_unfinished_requests() and engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    assert not engine.kv_cache_manager.pool._cached  # nothing of the interrupted step is findable
    (out,) = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
    assert out.num_cached_tokens == 0
    assert out.outputs[0].token_ids == hf_greedy(bundled_model, tuple(prompt), 8)


@pytest.mark.parametrize("where", ["forward", "sampler", "detokenizer"])
def test_failed_step_is_retried_by_the_next_step(bundled_model, monkeypatch, where):
    """The step that raised is rolled back: calling step() again serves the same requests, with outputs equal
    to an undisturbed run, and the finished requests' outputs all arrive."""
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=256, max_num_batched_tokens=16,
                                   num_kv_blocks=32)
    prompts = {"a": "ROMEO:\nBut, soft! what light", "b": "JULIET:\nO Romeo, Romeo!", "c": "HAMLET:"}
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=6, stop=["ll"], **GREEDY), deadline=1e18)
    reference = LLM(bundled_model, max_model_len=256).generate(
        list(prompts.values()), SamplingParams(max_tokens=6, stop=["ll"], **GREEDY), use_tqdm=False)
    texts = {}
    with monkeypatch.context() as m:
        inject(engine, m, where, Faults({2, 3, 5}))
        while engine.has_unfinished_requests():
            try:
                outs = engine.step()
            except (InjectedFault, RequestError):  # retried: the engine aborts nothing by itself
                continue
            texts.update({o.request_id: o.outputs[0] for o in outs if o.finished})
    assert [texts[r].token_ids for r in prompts] == [o.outputs[0].token_ids for o in reference]
    assert [texts[r].text for r in prompts] == [o.outputs[0].text for o in reference]
    assert engine.kv_cache_manager.num_free_blocks == 32
