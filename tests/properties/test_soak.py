"""Soak: random workloads on random engines, the books and the cache checked after every step.

Every policy (shortest-predicted-first included, with noisy predictions), recompute and swap, prefix caching on
and off, chunked prefill on and off, speculative decoding (n-gram, k 1 to 8) on and off, predicted-length-aware
admission on and off, block_size 1 to 32, pools of 1 to 64 blocks, random arrivals, aborts, deadlines and failing
steps (rolled back). After every
step: token budget, sequence slots, ref counts == block tables, nothing both free and referenced, swap blocks
held once (``check_scheduler``); every computed token in its request's blocks and every prefix-cache entry
holding the K/V its hash names (``KVShadow``); a sampled token within a bounded number of steps. At the end:
every request finished, every block (and swap block) free, and every output equal to the same request run
alone (aborted and timed-out ones: a prefix of it).

Two harnesses: the real scheduler with a fake model that samples from the cache content (fast: thousands of
workloads), and the real engine on the bundled model, compared with transformers' greedy output. CI runs
``SOAK_WORKLOADS`` fake and ``SOAK_ENGINE_WORKLOADS`` engine workloads; ``MINENGINE_SOAK=N`` runs N fake and
N // 50 (at least as many as CI) engine workloads, e.g. ``MINENGINE_SOAK=5000 python3 -m pytest -q
tests/properties/test_soak.py``.
"""

from __future__ import annotations

import os
import random

import pytest

from minengine import EngineConfig, LLMEngine, SamplingParams
from minengine.core.policies import POLICIES, PolicySettings
from minengine.core.predictors import NoisyOraclePredictor
from minengine.request import RequestStatus
from tests.conftest import hf_greedy
from tests.fake_engine import FakeEngine, StepClock
from tests.kv_shadow import check_scheduler, watch_runner

SOAK_WORKLOADS = 600  # fake-model workloads per CI run
SOAK_ENGINE_WORKLOADS = 12  # real-engine workloads per CI run
_N = int(os.environ.get("MINENGINE_SOAK", "0"))
NUM_FAKE = _N or SOAK_WORKLOADS
NUM_ENGINE = max(SOAK_ENGINE_WORKLOADS, _N // 50) if _N else SOAK_ENGINE_WORKLOADS


def random_spec_config(rng: random.Random) -> dict | None:
    """Speculative decoding off (half the time) or a random n-gram config (k 1..8, n-grams 1..4)."""
    if rng.random() < 0.5:
        return None
    lo = rng.randint(1, 3)
    return {"method": "ngram", "num_speculative_tokens": rng.choice([1, 2, 4, 8]), "prompt_lookup_min": lo,
            "prompt_lookup_max": rng.randint(lo, 4)}


def random_predictor(rng: random.Random):
    """None (the scheduler predicts max_tokens where it needs to) or a noisy oracle, sometimes far off."""
    return None if rng.random() < 0.5 else NoisyOraclePredictor(rng.choice([0.0, 0.5, 2.0]), seed=rng.randrange(99))


def random_engine_settings(rng: random.Random) -> dict:
    """One random engine: the FakeEngine's keyword arguments."""
    chunked = rng.random() < 0.75
    budget = rng.randint(1, 96)
    return dict(
        speculative_config=random_spec_config(rng), predictor=random_predictor(rng),
        reserve_predicted_kv=rng.random() < 0.25,
        policy=rng.choice(list(POLICIES)), preemption_mode=rng.choice(["recompute", "swap"]),
        prefix=rng.random() < 0.6, chunked=chunked, block_size=rng.choice([1, 2, 3, 4, 8, 16, 32]),
        num_blocks=rng.randint(1, 64), budget=budget, max_num_seqs=rng.randint(1, 8),
        threshold=rng.choice([0, 0, 1, 2, 5, 16]) if chunked else 0, swap_blocks=rng.randint(0, 64),
        shrink=rng.random() < 0.3, max_model_len=10_000 if chunked else budget,
        settings=PolicySettings(prefill_decode_ratio=rng.choice([0.25, 1.0, 3.0]),
                                splitfuse_target_tokens=rng.choice([None, rng.randint(1, budget)]),
                                priority_aging_steps=rng.randint(0, 8),
                                predicted_length_aging_steps=rng.randint(0, 8)),
    )


def random_requests(rng: random.Random, capacity: int, max_model_len: int) -> list[dict]:
    """Up to 10 requests that each fit the pool alone (``capacity`` tokens), often most of it (contention);
    families share prompt prefixes."""
    families = [[rng.randint(3, 60) for _ in range(64)] for _ in range(3)]
    out = []
    for i in range(rng.randint(1, 10)):
        room = min(capacity, max_model_len, 64)
        if room < 2:
            break
        plen = rng.randint(max(1, room // 2 - 8), room - 1) if rng.random() < 0.4 else rng.randint(1, min(48, room - 1))
        max_tokens = rng.randint(1, min(16, room - plen))
        family = rng.randrange(4)
        prompt = (families[family][:plen] if family < 3 else []) + [rng.randint(3, 60) for _ in range(plen)]
        prompt = prompt[:plen]
        out.append(dict(rid=f"r{i}", prompt=prompt, max_tokens=max_tokens, arrive=rng.randint(0, 8),
                        priority=rng.randint(0, 3), eos=rng.choice([None, None, rng.randint(3, 1000)]),
                        abort=rng.choice([None, None, None, rng.randint(0, 30)]),
                        deadline=rng.choice([None, None, None, rng.randint(1, 40)])))
    return out


def alone(req: dict, block_size: int, model: str = "hash") -> list[int]:
    eng = FakeEngine(num_blocks=512, block_size=block_size, budget=1024, max_model_len=10_000, content_sampling=model)
    eng.add("x", req["prompt"], req["max_tokens"], eos=req["eos"])
    eng.run()
    return eng.finished[0].output_token_ids


def soak_one(seed: int) -> None:
    rng = random.Random(seed)
    cfg = random_engine_settings(rng)
    # a repetitive fake model when speculating, most of the time, so proposals are accepted as well as rejected
    model = "markov" if cfg["speculative_config"] and rng.random() < 0.7 else "hash"
    eng = FakeEngine(content_sampling=model, **cfg)
    reqs = random_requests(rng, cfg["num_blocks"] * cfg["block_size"], cfg["max_model_len"])
    fail_rate = rng.choice([0.0, 0.0, 0.05, 0.2])
    pending = sorted(reqs, key=lambda r: r["arrive"])
    by_id = {r["rid"]: r for r in reqs}
    ended: dict[str, tuple[RequestStatus, list[int]]] = {}
    w = max((len(r["prompt"]) + r["max_tokens"] for r in reqs), default=1)
    gap_bound, gap, failures = len(reqs) * w, 0, 0
    while pending or eng.sched.has_unfinished_requests():
        while pending and pending[0]["arrive"] <= eng.steps:
            r = pending.pop(0)
            eng.add(r["rid"], r["prompt"], r["max_tokens"], eos=r["eos"], priority=r["priority"])
        for r in reqs:  # aborts and deadlines, by step
            for key, status in (("abort", RequestStatus.FINISHED_ABORTED),
                                ("deadline", RequestStatus.FINISHED_TIMEOUT)):
                if r[key] is not None and r[key] + r["arrive"] == eng.steps:
                    for done in eng.sched.finish_requests([r["rid"]], status):
                        ended[done.request_id] = (status, list(done.output_token_ids))
        eng.check_invariants()
        if not eng.sched.has_unfinished_requests():
            eng.steps += 1
            continue
        if rng.random() < fail_rate and failures < 20:
            failures += 1
            eng.step(fail=True)
            continue
        out = eng.step()
        gap = 0 if any(s.sample for s in out.scheduled) else gap + 1
        assert gap <= gap_bound, f"seed {seed}: {gap} steps without a token"
        assert eng.steps < 50_000, f"seed {seed}: no end"
    for r in eng.finished:
        ended[r.request_id] = (r.status, list(r.output_token_ids))
    assert set(ended) == set(by_id), f"seed {seed}: not every request ended"
    for rid, (status, tokens) in ended.items():
        ref = alone(by_id[rid], cfg["block_size"], model)
        if status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_TIMEOUT):
            assert tokens == ref[:len(tokens)], f"seed {seed}: {rid} output differs from running alone"
        else:
            assert tokens == ref, f"seed {seed}: {rid} output differs from running alone"
    assert eng.kv.num_free_blocks == cfg["num_blocks"] and not eng.kv.req_to_blocks
    if cfg["preemption_mode"] == "swap":
        eng.sched.swap_space.begin_step()
        assert eng.sched.swap_space.num_free_blocks == eng.sched.swap_space.num_blocks


@pytest.mark.parametrize("chunk", range(4))
def test_soak_scheduler(chunk):
    """``NUM_FAKE`` workloads (in four chunks), each a random engine, workload, aborts, deadlines, failures."""
    for seed in range(chunk, NUM_FAKE, 4):
        soak_one(seed)


@pytest.mark.parametrize("seed", range(NUM_ENGINE))
def test_soak_engine(bundled_model, bundled_prompts, seed):
    """The real engine and model, random settings and workloads (aborts, deadlines): the books and the KV
    shadow after every step, greedy outputs equal to transformers', every block free at the end."""
    rng = random.Random(10_000 + seed)
    s = random_engine_settings(rng)
    max_model_len = max(s["max_model_len"], 8) if s["chunked"] else max(s["budget"], 64)
    budget = s["budget"] if s["chunked"] else max_model_len
    num_blocks = max(s["num_blocks"], -(-64 // s["block_size"]))  # room for the longest request (64 tokens)
    config = EngineConfig(model=bundled_model, block_size=s["block_size"], num_kv_blocks=num_blocks,
                          max_num_batched_tokens=budget, max_num_seqs=s["max_num_seqs"], max_model_len=256,
                          enable_chunked_prefill=s["chunked"], long_prefill_token_threshold=s["threshold"],
                          enable_prefix_caching=s["prefix"], scheduling_policy=s["policy"],
                          preemption_mode=s["preemption_mode"], swap_space_blocks=s["swap_blocks"],
                          shrink_prefill_chunks=s["shrink"], prefill_decode_ratio=s["settings"].prefill_decode_ratio,
                          priority_aging_steps=s["settings"].priority_aging_steps,
                          predicted_length_aging_steps=s["settings"].predicted_length_aging_steps,
                          speculative_config=s["speculative_config"], output_length_predictor=s["predictor"],
                          reserve_predicted_kv=s["reserve_predicted_kv"])
    if not s["chunked"]:
        config = EngineConfig(**{**config.__dict__, "max_num_batched_tokens": 256})
    clock = StepClock()
    engine = LLMEngine(config, clock=clock)
    shadow = watch_runner(engine)
    stream = bundled_prompts[-1]
    prompts, limits, aborts = {}, {}, {}
    for i in range(rng.randint(2, 7)):
        start = rng.choice([0, 0, 100, 200, rng.randrange(800)])  # shared starts: prefix hits
        n = rng.randint(1, 48)
        prompts[f"r{i}"] = stream[start:start + n]
        limits[f"r{i}"] = rng.randint(1, 64 - n)
        deadline = rng.choice([None, None, None, clock.now + rng.randint(5, 80)])
        engine.add_request(f"r{i}", {"prompt_token_ids": prompts[f"r{i}"]},
                           SamplingParams(temperature=0, max_tokens=limits[f"r{i}"], ignore_eos=True),
                           priority=rng.randint(0, 3), deadline=deadline)
        if rng.random() < 0.2:
            aborts[f"r{i}"] = rng.randint(0, 20)
    final = {}
    while engine.has_unfinished_requests():
        step = len(engine.traces)
        engine.abort_request([rid for rid, at in aborts.items() if at == step])
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
        check_scheduler(engine.scheduler)
        shadow.check(engine.scheduler)
        assert len(engine.traces) < 5000
    for rid, p in prompts.items():
        out = engine.request_metrics[rid]
        if rid not in final:  # aborted: never reported by step()
            assert out.finish_reason == "abort"
            continue
        tokens = final[rid].outputs[0].token_ids
        ref = hf_greedy(bundled_model, tuple(p), 64)
        if final[rid].outputs[0].finish_reason == "length":
            assert tokens == ref[:limits[rid]], rid
        else:
            assert tokens == ref[:len(tokens)], rid
    assert engine.kv_cache_manager.num_free_blocks == num_blocks
