"""The fleet lab (``minengine.fleet``): many token-free replicas of the real engine on modelled GPUs.

- one replica gives exactly the per-request metrics of ``LLMEngine`` replaying the trace with the same modelled
  clock and a token-free runner (every policy, preemption by recompute and swap, prefix hits);
- routers send every request somewhere and never to a replica that cannot hold it (heterogeneous pools);
- with an infinite link, a disaggregated fleet is its prefill timing (a colocated fleet of the prefill replicas
  answering one token) plus its decode timing (an engine receiving the KV at the prefill's end);
- conservation on random fleets: every request finishes once with all its tokens, every block is free again,
  every replica's load counters return to zero; determinism for a seed;
- the engine changes the fleet needs: the O(1) cached-free-block count, external KV at admission (vLLM's KV
  connector), the cost model's fast path, no torch on the token-free path.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine.config import EngineConfig
from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager, cdiv
from minengine.core.preempt_between_steps import preempt_request
from minengine.fleet import (
    LINKS,
    ROUTERS,
    FleetConfig,
    FleetSimulator,
    KVLink,
    KVStore,
    KVStoreConfig,
    PercentileSLO,
    ReplicaSpec,
    infinite_cache_hits,
    kv_pool_blocks,
    simulate,
    synthetic_prompt_ids,
    token_free_engine,
)
from minengine.fleet.kv_store import DRAM, SSD
from minengine.fleet.request import prompt_block_hashes
from minengine.outputs import RequestMetrics
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams
from minengine.timing import StepCostModel, StepWork
from minengine.timing.model_shape import LLAMA_3_8B
from minengine.workloads import Trace, TraceRequest, replay
from tests.fake_engine import FakeEngine

SMALL = dict(max_num_batched_tokens=128, max_num_seqs=8, max_model_len=2048)  # FleetConfig / EngineConfig fields


def make_trace(n: int, seed: int = 0, rate: float = 40.0, max_prompt: int = 300, max_output: int = 40,
               families: int = 4, shared: int = 64) -> Trace:
    """``n`` requests, Poisson arrivals at ``rate``/s; prompts of ``families`` groups share their first ``shared``
    tokens (so prefix caching hits), the rest of each prompt is distinct."""
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        plen, olen, fam = rng.randint(1, max_prompt), rng.randint(1, max_output), rng.randrange(families)
        head = [1000 + fam * 100 + k for k in range(shared)]
        tail = [50_000 + i * 400 + k for k in range(plen)]
        ids = (head + tail)[:plen] if rng.random() < 0.7 else tail
        reqs.append(TraceRequest(t, plen, olen, ids, f"r{i}"))
    return Trace(reqs, source=f"test(seed={seed})")


def engine_config(num_kv_blocks: int, **overrides) -> EngineConfig:
    fields = dict(num_kv_blocks=num_kv_blocks, block_size=16, trace_block_tables=False, num_cpu_threads=None, **SMALL)
    fields.update(overrides)
    return EngineConfig(**fields)


# ---- one replica == the engine ------------------------------------------------------------------------------
@pytest.mark.parametrize("policy,mode", [("decode-first", "recompute"), ("prefill-first", "recompute"),
                                         ("balanced", "swap"), ("round-robin", "recompute")])
def test_one_replica_equals_llm_engine_replay(policy, mode):
    trace = make_trace(60, seed=1, rate=200.0)
    cfg = FleetConfig(replicas=(ReplicaSpec(num_kv_blocks=40),), scheduling_policy=policy, preemption_mode=mode,
                      **SMALL)
    fleet = simulate(trace, cfg)
    engine = token_free_engine(engine_config(40, scheduling_policy=policy, preemption_mode=mode), "llama-3-8b",
                               max_position_embeddings=SMALL["max_model_len"])
    ref = replay(engine, trace)
    assert fleet.request_metrics == ref.request_metrics  # every field: times, ITLs, preemptions, cached tokens
    s = fleet.summary()
    assert s.num_preemptions == ref.summary().num_preemptions > 0, "the pool must be small enough to preempt"
    assert s.prefix_hit_tokens == ref.summary().prefix_hit_tokens > 0
    assert fleet.num_steps == len(ref.steps)


# ---- routers ----------------------------------------------------------------------------------------------------
HETERO = (ReplicaSpec(num_kv_blocks=6), ReplicaSpec(num_kv_blocks=64), ReplicaSpec(num_kv_blocks=20),
          ReplicaSpec(num_kv_blocks=64))


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_routers_send_every_request_to_a_replica_that_can_hold_it(router):
    trace = make_trace(120, seed=2, rate=80.0, max_prompt=600, max_output=60)
    sim = FleetSimulator(FleetConfig(replicas=HETERO, router=router, **SMALL), trace)
    result = sim.run()
    blocks = [r.num_kv_blocks for r in sim.replicas]
    used = set()
    for req in sim.requests:
        first, decode = result.assignments[req.request_id]
        assert decode == -1 and 0 <= first < len(blocks)
        assert cdiv(req.prompt_len + req.output_len, 16) <= blocks[first], (router, req.request_id)
        used.add(first)
    assert len(result.request_metrics) == len(trace)
    assert 0 in used or router in ("prefix-aware", "least-kv-usage"), "the small replica takes small requests"
    assert sum(r.num_requests for r in result.replicas) == len(trace)


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_disaggregated_routers_respect_both_pools(router):
    replicas = (ReplicaSpec("prefill", num_kv_blocks=8), ReplicaSpec("prefill", num_kv_blocks=64),
                ReplicaSpec("decode", num_kv_blocks=10), ReplicaSpec("decode", num_kv_blocks=64))
    trace = make_trace(80, seed=3, rate=60.0, max_prompt=500, max_output=80)
    sim = FleetSimulator(FleetConfig(replicas=replicas, router=router, decode_router=router, **SMALL), trace)
    result = sim.run()
    for req in sim.requests:
        p, d = result.assignments[req.request_id]
        assert sim.replicas[p].role == "prefill" and sim.replicas[p].can_hold(req.prompt_len + 1)
        if req.output_len > 1:
            assert sim.replicas[d].role == "decode" and sim.replicas[d].can_hold(req.prompt_len + req.output_len)
        else:
            assert d == -1  # one output token: the prefill replica answers alone
    assert result.transfers.count == sum(r.output_len > 1 for r in sim.requests)


def test_prefix_aware_router_finds_the_cached_prefix():
    """Four families of long shared prefixes over four replicas: prefix-aware keeps each family on one replica,
    round-robin spreads it, so the prefix-aware fleet serves more prompt tokens from cache."""
    trace = make_trace(160, seed=4, rate=30.0, max_prompt=400, shared=320, families=4)
    cfg = dict(replicas=(ReplicaSpec(num_kv_blocks=200),) * 4, **SMALL)
    aware = simulate(trace, FleetConfig(router="prefix-aware", **cfg))
    spread = simulate(trace, FleetConfig(router="round-robin", **cfg))
    assert aware.prefix_hit_rate > spread.prefix_hit_rate + 0.05
    assert aware.router_counts["num_by_cache"] > 0


# ---- disaggregation with an infinite link ----------------------------------------------------------------------
def test_infinite_link_single_request_matches_colocated():
    trace = Trace([TraceRequest(0.0, 700, 30, None, "only")])
    co = simulate(trace, FleetConfig.colocated(1, **SMALL))
    dis = simulate(trace, FleetConfig.disaggregated(1, 1, link="infinite", **SMALL))
    a, b = co.request_metrics["only"], dis.request_metrics["only"]
    assert (a.ttft, a.finished_time, a.itls, a.num_output_tokens) == (b.ttft, b.finished_time, b.itls, 30)


def test_infinite_link_is_prefill_timing_plus_decode_timing():
    trace = make_trace(50, seed=5, rate=100.0, max_output=30)
    prefill, decode = ReplicaSpec("prefill", num_kv_blocks=60), ReplicaSpec("decode", num_kv_blocks=40)
    dis_sim = FleetSimulator(FleetConfig(replicas=(prefill, prefill, decode), link="infinite", **SMALL), trace)
    dis = dis_sim.run()

    # prefill timing: the same prefill replicas, colocated, answering one token per request
    one_token = trace.with_requests([TraceRequest(r.arrival_time, r.prompt_len, 1, r.prompt_token_ids, r.request_id)
                                     for r in trace])
    pre = simulate(one_token, FleetConfig(replicas=(ReplicaSpec(num_kv_blocks=60),) * 2, **SMALL))
    for rid, m in dis.request_metrics.items():
        assert m.ttft == pre.request_metrics[rid].ttft
        assert m.first_scheduled_time == pre.request_metrics[rid].first_scheduled_time

    # decode timing: one engine that receives each prompt's KV when its prefill ended (no transfer time)
    engine = token_free_engine(engine_config(40), "llama-3-8b", max_position_embeddings=SMALL["max_model_len"])
    reqs = {r.request_id: r for r in dis_sim.requests}
    pending = deque(sorted((dis.request_metrics[r.request_id].first_token_time, r.index, r.request_id)
                           for r in dis_sim.requests if r.output_len > 1))

    def add(t: float, rid: str) -> None:
        r = reqs[rid]
        ids = trace[r.index].prompt_token_ids or synthetic_prompt_ids(r.index, r.prompt_len, LLAMA_3_8B.vocab_size)
        params = SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True)
        request = engine.make_request(rid, {"prompt_token_ids": ids}, params, arrival_time=t)
        request.output_token_ids = [0]
        request.num_external_computed_tokens = len(ids)
        engine.enqueue(request)

    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= engine.clock():
            t, _, rid = pending.popleft()
            add(t, rid)
        if not engine.has_unfinished_requests():
            engine.clock.advance_to(pending[0][0])
            continue
        engine.step()
    for rid, m in engine.request_metrics.items():
        full = dis.request_metrics[rid]
        assert full.finished_time == m.finished_time
        assert full.itls[1:] == m.itls
        assert full.first_token_time + full.itls[0] == pytest.approx(m.first_token_time, rel=1e-12)
    assert dis.transfers.count == len(engine.request_metrics) and dis.transfers.total_time_s == 0


def test_finite_link_delays_the_second_token_by_the_transfer():
    trace = Trace([TraceRequest(0.0, 2000, 10, None, "a")])
    inf = simulate(trace, FleetConfig.disaggregated(1, 1, link="infinite"))
    eth = simulate(trace, FleetConfig.disaggregated(1, 1, link="ethernet-100g"))
    expected = LINKS["ethernet-100g"].transfer_time(2000 * LLAMA_3_8B.kv_bytes_per_token)
    assert eth.transfers.total_time_s == pytest.approx(expected)
    assert eth.request_metrics["a"].itls[0] == pytest.approx(inf.request_metrics["a"].itls[0] + expected)
    assert eth.request_metrics["a"].ttft == inf.request_metrics["a"].ttft


# ---- conservation and determinism --------------------------------------------------------------------------------
fleets = st.fixed_dictionaries({
    "disaggregated": st.booleans(), "n1": st.integers(1, 3), "n2": st.integers(1, 3),
    "blocks": st.integers(12, 80), "router": st.sampled_from(sorted(ROUTERS)),
    "decode_router": st.sampled_from(sorted(ROUTERS)), "policy": st.sampled_from(["decode-first", "prefill-first",
                                                                                  "round-robin"]),
    "mode": st.sampled_from(["recompute", "swap"]), "prefix": st.booleans(), "budget": st.sampled_from([32, 128, 512]),
    "link": st.sampled_from(sorted(LINKS)), "seed": st.integers(0, 3),
    "store": st.sampled_from([None, "dram", "ssd", "nodes"]),
})
STORES = {None: None, "dram": KVStoreConfig(dram_bytes_per_node=8 * 16 * LLAMA_3_8B.kv_bytes_per_token),
          "ssd": KVStoreConfig(dram_bytes_per_node=4 * 16 * LLAMA_3_8B.kv_bytes_per_token,
                               ssd_bytes_per_node=16 * 16 * LLAMA_3_8B.kv_bytes_per_token),
          "nodes": KVStoreConfig(gpus_per_node=1)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=fleets, n=st.integers(1, 40), trace_seed=st.integers(0, 1000))
def test_conservation_on_random_fleets(f, n, trace_seed):
    trace = make_trace(n, seed=trace_seed, rate=50.0, max_prompt=200, max_output=30)
    common = dict(router=f["router"], decode_router=f["decode_router"], scheduling_policy=f["policy"],
                  preemption_mode=f["mode"], enable_prefix_caching=f["prefix"], max_num_batched_tokens=f["budget"],
                  link=f["link"], seed=f["seed"], max_num_seqs=8, max_model_len=2048,
                  kv_store=STORES[f["store"]] if f["prefix"] else None)
    if f["disaggregated"]:
        replicas = (ReplicaSpec("prefill", num_kv_blocks=f["blocks"]),) * f["n1"] + \
                   (ReplicaSpec("decode", num_kv_blocks=f["blocks"]),) * f["n2"]
    else:
        replicas = (ReplicaSpec(num_kv_blocks=f["blocks"]),) * f["n1"]
    sim = FleetSimulator(FleetConfig(replicas=replicas, **common), trace)
    result = sim.run()
    assert list(result.request_metrics) == [r.request_id for r in sim.requests]  # each exactly once
    assert sim.num_finishes == n
    for req in sim.requests:
        m = result.request_metrics[req.request_id]
        assert m.num_output_tokens == req.output_len and m.finish_reason == "length"
        assert len(m.itls) == req.output_len - 1 and m.ttft >= 0
    for replica in sim.replicas:
        assert not replica.engine.has_unfinished_requests()
        assert replica.engine.kv_cache_manager.num_free_blocks == replica.num_kv_blocks
        swap_space = getattr(replica.engine.scheduler, "swap_space", None)  # the swap door's, when open
        assert swap_space is None or swap_space.num_used_blocks == 0
        assert (replica.outstanding_requests, replica.outstanding_tokens, replica.kv_load) == (0, 0, 0.0)
        assert replica.queued_prefill_tokens == 0
    if result.store is not None:  # every load was judged at its request's admission; capacities held
        s = result.store
        assert s.used_blocks + s.wasted_blocks == s.loaded_blocks and sim.store.loads_in_flight == 0
        assert s.peak_dram_blocks <= s.num_nodes * s.dram_capacity_blocks
        assert s.peak_ssd_blocks <= s.num_nodes * s.ssd_capacity_blocks


def test_deterministic_for_a_seed():
    trace = make_trace(80, seed=6, rate=80.0)
    cfg = FleetConfig.disaggregated(2, 2, router="random", decode_router="random", seed=3, **SMALL)
    a, b = simulate(trace, cfg), simulate(trace, cfg)
    assert a.request_metrics == b.request_metrics and a.assignments == b.assignments
    assert [r.busy_time_s for r in a.replicas] == [r.busy_time_s for r in b.replicas]
    other = simulate(trace, FleetConfig.disaggregated(2, 2, router="random", decode_router="random", seed=4, **SMALL))
    assert other.assignments != a.assignments  # the seed is what the random router draws from


# ---- results -------------------------------------------------------------------------------------------------------
def test_result_numbers_and_timeline():
    trace = make_trace(40, seed=7, rate=20.0)
    cfg = FleetConfig.colocated(2, timeline_interval_s=0.0, keep_step_traces=True, **SMALL)
    sim = FleetSimulator(cfg, trace)
    result = sim.run()
    for stats, replica in zip(result.replicas, sim.replicas):
        assert stats.num_steps == len(replica.step_traces)
        starts = [t.start_time for t in replica.step_traces]
        assert set(starts) <= set(stats.times) and stats.times == sorted(stats.times)  # interval 0: every step
        assert (stats.used_blocks[-1], stats.running[-1], stats.waiting[-1]) == (0, 0, 0)  # idle at the end
        assert stats.busy_time_s == pytest.approx(sum(t.duration for t in replica.step_traces))
        assert stats.peak_used_blocks == max(t.num_used_blocks for t in replica.step_traces)
    busy = [r.busy_time_s for r in result.replicas]
    assert result.load_imbalance() == pytest.approx(max(busy) / (sum(busy) / 2))
    s = result.summary()
    assert s.num_requests == 40 and s.num_steps == result.num_steps
    ttfts = sorted(m.ttft for m in result.request_metrics.values())
    assert result.latency("ttft", 100) == ttfts[-1]
    assert "steps/s" in result.describe() and result.steps_per_second > 0


def test_percentile_slo_is_distserves():
    ms = {}
    for i in range(10):  # TTFT 0.1 .. 1.0 s; TPOT 10 ms except the last request (100 ms)
        ms[str(i)] = RequestMetrics(arrival_time=0.0, first_token_time=0.1 * (i + 1), num_output_tokens=11,
                                    finished_time=0.1 * (i + 1) + (1.0 if i == 9 else 0.1), finish_reason="length")
    from minengine.fleet.results import FleetResult, TransferStats

    r = FleetResult(FleetConfig(), ms, [], TransferStats(), 0, 0, 1.0, 1.0)
    p90_ttft = r.latency("ttft", 90)
    assert p90_ttft == pytest.approx(0.91)
    assert r.meets_percentile_slo(PercentileSLO(ttft_s=0.95, tpot_s=0.02))  # P90 TPOT is still 10 ms
    assert not r.meets_percentile_slo(PercentileSLO(ttft_s=0.9))
    assert not r.meets_percentile_slo(PercentileSLO(tpot_s=0.02, percentile=99))
    assert r.attainment(PercentileSLO(ttft_s=0.5)) == 0.5
    with pytest.raises(ValueError, match="ttft_s"):
        PercentileSLO(ttft_s=0)


# ---- sizes, links, validation ---------------------------------------------------------------------------------------
def test_kv_pool_and_link_arithmetic():
    # H100 80 GB x 0.9 - Llama-3-8B BF16 weights, in blocks of 16 tokens x 128 KiB
    expected = int((80e9 * 0.9 - LLAMA_3_8B.num_params * 2) // (16 * 131072))
    assert LLAMA_3_8B.kv_bytes_per_token == 131072 and kv_pool_blocks("h100", "llama-3-8b") == expected
    assert kv_pool_blocks("h100", "llama-3-70b", tp=4) > kv_pool_blocks("h100", "llama-3-70b", tp=2) > 0
    with pytest.raises(ValueError, match="do not fit"):
        kv_pool_blocks("l4", "llama-3-70b")
    ib = LINKS["ib-400g"]
    assert ib.transfer_time(1000 * 131072) == pytest.approx(10e-6 + 131_072_000 / 50e9)
    assert ib.transfer_time(1000 * 131072, lanes=2) == pytest.approx(10e-6 + 131_072_000 / 100e9)
    assert LINKS["infinite"].transfer_time(1e12) == 0.0
    with pytest.raises(ValueError, match="bandwidth"):
        KVLink("x", 0)


@pytest.mark.parametrize("fields,match", [
    (dict(router="fastest"), "router"), (dict(decode_router="x"), "decode_router"), (dict(link="wifi"), "KV link"),
    (dict(replicas=(ReplicaSpec("prefill"),)), "decode"), (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(replicas=(ReplicaSpec("mixed"), ReplicaSpec("decode"))), "all 'mixed'"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"), (dict(scheduling_policy="lifo"), "scheduling"),
    (dict(timeline_interval_s=-1), "timeline_interval_s"), (dict(replicas=()), "replicas"),
])
def test_config_rejects_bad_values(fields, match):
    with pytest.raises(ValueError, match=match):
        FleetConfig(**fields)
    with pytest.raises(ValueError, match="role"):
        ReplicaSpec("both")
    with pytest.raises(ValueError, match="num_replicas"):
        FleetConfig.colocated(0)


def test_too_long_requests_are_clipped_to_the_largest_pool():
    trace = Trace([TraceRequest(0.0, 5000, 100, None, "long"), TraceRequest(0.1, 10, 5, None, "short")])
    result = simulate(trace, FleetConfig(replicas=(ReplicaSpec(num_kv_blocks=64),), **SMALL))
    assert result.num_clipped == 1
    m = result.request_metrics["long"]
    assert m.num_prompt_tokens + m.num_output_tokens == 64 * 16 and m.num_output_tokens == 100


def test_synthetic_prompts_share_no_first_block():
    vocab = LLAMA_3_8B.vocab_size
    firsts = {tuple(synthetic_prompt_ids(i, 16, vocab)) for i in range(5000)}
    assert len(firsts) == 5000
    ids = synthetic_prompt_ids(12345, 300_000, vocab)  # longer than the vocabulary: wraps
    assert len(ids) == 300_000 and all(0 <= t < vocab for t in ids[::997])
    assert synthetic_prompt_ids(3, 16, vocab, seed=1) != synthetic_prompt_ids(3, 16, vocab)


def test_fleet_path_imports_no_torch():
    code = ("import sys\nfrom minengine.fleet import FleetConfig, simulate\nfrom minengine.workloads import Trace, "
            "TraceRequest\nr = simulate(Trace([TraceRequest(0.0, 100, 5, None, 'a')]), FleetConfig.disaggregated(1, 1))"
            "\nassert len(r.request_metrics) == 1\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- the engine pieces the fleet relies on -----------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(work=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 8), st.integers(0, 2)), min_size=1, max_size=10),
       blocks=st.integers(10, 40), reset_at=st.integers(0, 30), mode=st.sampled_from(["recompute", "swap"]))
def test_cached_free_block_count_matches_a_recount(work, blocks, reset_at, mode):
    eng = FakeEngine(num_blocks=blocks, block_size=4, budget=24, max_num_seqs=4, preemption_mode=mode,
                     swap_blocks=blocks // 2)
    for i, (plen, max_tokens, fam) in enumerate(work):
        if cdiv(plen + max_tokens, 4) <= blocks:
            eng.add(str(i), [fam * 7 + j % 5 + 3 for j in range(plen)], max_tokens)
    pool = eng.kv.pool

    def recount() -> int:
        return sum(1 for b in pool.blocks if pool.is_free(b) and b.block_hash is not None)

    while eng.sched.has_unfinished_requests():
        eng.step()
        assert pool.num_cached_free_blocks == recount()
        for rid, table in eng.kv.req_to_blocks.items():  # the id copy of each block table stays in step
            assert eng.kv.get_block_ids(rid) == [b.block_id for b in table]
        if eng.steps == reset_at and not eng.kv.num_used_blocks:
            pool.reset_prefix_cache()
            assert pool.num_cached_free_blocks == recount() == 0
    assert pool.num_cached_free_blocks == recount()


def test_external_kv_is_admitted_only_when_its_blocks_are_free():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    sched = make_scheduler(kv, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=100)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    sched.add_request(Request("big", list(range(3, 23)), params, 0.0))  # 20 tokens: 5 blocks, then 6
    sched.update_from_output(sched.schedule(), {"big": [7]})
    received = Request("rx", list(range(100, 112)), params, 0.0)  # 12 prompt tokens whose KV arrived
    received.output_token_ids = [9]
    received.num_external_computed_tokens = 12
    sched.add_request(received)
    out = sched.schedule()  # 6 of 8 blocks held: rx needs ceil(13 / 4) = 4
    assert [s.request_id for s in out.scheduled] == ["big"] and received.status is RequestStatus.WAITING
    sched.update_from_output(out, {"big": [7]})
    sched.finish_requests(["big"], RequestStatus.FINISHED_ABORTED)
    out = sched.schedule()
    sched.rollback(out)  # a failed step gives the received KV back, untouched
    assert received.status is RequestStatus.WAITING and received.num_external_computed_tokens == 12
    assert received.num_computed_tokens == 0 and kv.num_free_blocks == 8
    out = sched.schedule()
    (s,) = out.scheduled
    assert (s.request_id, s.start_pos, s.num_new_tokens, s.sample, s.is_prefill) == ("rx", 12, 1, True, False)
    assert out.prefix_hit_tokens == 0 and len(kv.get_block_ids("rx")) == 4
    assert received.num_external_computed_tokens == 0  # consumed: a recompute preemption recomputes it
    sched.update_from_output(out, {"rx": [11]})
    assert all(kv.pool.get_cached_block(h) is not None for h in received.block_hashes[:3])  # received KV indexed
    preempt_request(sched, received, out)
    assert received.num_computed_tokens == 0
    sched.add_request(Request("filler", [1] * 4, params, 0.0))
    out = sched.schedule()
    assert out.scheduled[0].request_id == "rx" and out.scheduled[0].start_pos == 12  # hits its own cached blocks


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_cost_of_is_cost_of_step_work_bit_for_bit(tp):
    from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput

    rng = random.Random(tp)
    for shape in ("llama-3-8b", "llama-3-70b", "qwen2.5-7b"):
        model = StepCostModel("h100", shape, tp=tp)
        for _ in range(50):
            scheduled = []
            for i in range(rng.randint(0, 6)):
                n = rng.choice([1, 1, 7, 512, 2048])
                scheduled.append(ScheduledRequest(str(i), [0] * n, rng.randint(0, 9000), [], rng.random() < 0.8,
                                                  n > 1, SamplingParams(), 0))
            so = SchedulerOutput(scheduled=scheduled, blocks_to_swap_out=[(0, 0)] * rng.randint(0, 3),
                                 blocks_to_swap_in=[(0, 0)] * rng.randint(0, 2))
            assert model.cost_of(so) == model.cost(StepWork.from_scheduler_output(so))
    assert math.isfinite(model.cost_of(SchedulerOutput()).time_s)


def test_disable_log_stats_skips_prometheus_only():
    trace = make_trace(30, seed=8, rate=100.0)
    runs = {}
    for disabled in (False, True):
        engine = token_free_engine(engine_config(40, disable_log_stats=disabled), "llama-3-8b",
                                   max_position_embeddings=SMALL["max_model_len"])
        runs[disabled] = (engine, replay(engine, trace))
    (on, a), (off, b) = runs[False], runs[True]
    assert a.request_metrics == b.request_metrics and a.summary() == b.summary()
    assert any(m.name == "vllm:num_requests_running" for m in on.get_metrics())
    with pytest.raises(RuntimeError, match="disable_log_stats"):
        off.get_metrics()


def test_lanes_figures_resample_each_replica_timeline():
    from minengine.viz.fleet_figures import (
        fleet_description,
        fleet_lanes_figure,
        fleet_load_figure,
        nice_ceiling,
        resample,
        resample_max,
    )

    assert resample([1.0, 2.0, 4.0], [10, 20, 40], [0.5, 1.0, 3.9, 5.0]) == [0, 10, 20, 40]
    # a load in flight from 1.2 s to 1.25 s, between two bin centres (1 s, 2 s): the bin max sees it, a centre not
    times, loads, grid = [0.0, 1.2, 1.25, 2.6], [0, 1, 0, 2], [1.0, 2.0, 3.0, 4.0]
    assert resample(times, loads, grid) == [0, 0, 2, 2]
    assert resample_max(times, loads, grid) == [1, 0, 2, 2]
    assert resample_max([2.0], [5], [1.0, 2.0]) == [0, 5] and resample_max([], [], [1.0]) == [0]
    result = simulate(make_trace(60, seed=9, rate=60.0), FleetConfig.disaggregated(2, 2, timeline_interval_s=0.0,
                                                                                  **SMALL))
    fig = fleet_lanes_figure(result, "kv", num_bins=50)
    heat = fig.data[0]
    assert list(heat.y) == ["P0", "P1", "D0", "D1"] and len(heat.z) == 4 and len(heat.z[0]) == 50
    assert all(0 <= v <= 100 for row in heat.z for v in row) and max(max(row) for row in heat.z) > 0
    # the colour scale fits the data (a 0-100 % scale made every lane alike at ~10 % use) and says so
    peak = max(max(row) for row in heat.z)
    assert heat.zmin == 0 and peak <= heat.zmax <= 1.5 * peak and heat.zmax < 100
    assert f"0-{heat.zmax:g} %" in heat.colorbar.title.text
    assert [nice_ceiling(x) for x in (0, 0.07, 1, 1.01, 9.9, 10.3, 27, 99)] == [1, 0.08, 1, 1.5, 10, 15, 30, 100]
    assert "modelled: H100 SXM, Llama-3-8B shapes" in fig.layout.title.text
    queue = fleet_lanes_figure(result, "queue", lang="zh", num_bins=20)
    assert "副本泳道" in queue.layout.title.text
    # a count lane starts its scale at 0 and spans at least 1 (an idle queue is the scale's bottom colour)
    assert queue.data[0].zmin == 0 and queue.data[0].zmax >= max(1, max(max(row) for row in queue.data[0].z))
    load = fleet_load_figure(result)
    assert [bar.y for bar in load.data][0] == tuple(r.busy_time_s for r in result.replicas)
    # the right axis (requests) ticks at round values of its own, not synced to the left grid (plotly.js's default)
    assert load.layout.yaxis2.tickmode == "auto" and load.layout.yaxis2.showgrid is False
    assert "分离式" in fleet_description(result.config, "zh") and fleet_description(result.config) == \
        result.config.describe()
    with pytest.raises(ValueError, match="metric"):
        fleet_lanes_figure(result, "tokens")


# ---- planning: goodput and capacity searches ------------------------------------------------------------------------
def test_max_goodput_brackets_the_slo():
    """The multiplier it returns meets the SLO when simulated again; the failing one does not; goodput and its
    per-GPU share follow from the trace's rate."""
    from minengine.fleet.planning import max_goodput

    trace = make_trace(60, seed=8, rate=10.0, max_output=30)
    cfg = FleetConfig.colocated(2, **SMALL)
    slo = PercentileSLO(ttft_s=0.05, tpot_s=0.02)
    g = max_goodput(trace, cfg, slo, start_multiplier=1.0, rel_tol=0.2, max_probes=12)
    assert g.bounded and 0 < g.multiplier < g.failing_multiplier <= g.multiplier * 1.2 + 1e-9
    from minengine.workloads import speed_up

    assert simulate(speed_up(trace, g.multiplier), cfg).meets_percentile_slo(slo)
    assert not simulate(speed_up(trace, g.failing_multiplier), cfg).meets_percentile_slo(slo)
    assert g.goodput == pytest.approx(g.multiplier * trace.mean_rate) and g.per_gpu == pytest.approx(g.goodput / 2)
    assert [p.passed for p in g.probes if p.value == g.multiplier] == [True]
    with pytest.raises(ValueError, match="rate"):
        max_goodput(trace[:1], cfg, slo)


def test_min_replicas_is_the_fewest_that_meet_the_slo():
    from minengine.fleet.planning import min_replicas

    trace = make_trace(80, seed=9, rate=120.0, max_output=30)
    slo = PercentileSLO(ttft_s=0.05, tpot_s=0.02)
    make = lambda n: FleetConfig.colocated(n, **SMALL)  # noqa: E731
    plan = min_replicas(trace, make, slo, start=1, max_replicas=64)
    n = plan.num_replicas
    assert n is not None and n > 1, "the test's load must need more than one replica"
    assert simulate(trace, make(n)).meets_percentile_slo(slo)
    assert not simulate(trace, make(n - 1)).meets_percentile_slo(slo)
    assert plan.result.request_metrics == simulate(trace, make(n)).request_metrics
    assert min_replicas(trace, make, slo, start=n + 3, max_replicas=64).num_replicas == n  # from above: halves
    assert min_replicas(trace, make, PercentileSLO(ttft_s=1e-9), max_replicas=4).num_replicas is None
    with pytest.raises(ValueError, match="start"):
        min_replicas(trace, make, slo, start=0)


# ---- the real traces (skipped without ../shared/data) ---------------------------------------------------------------
def test_mooncake_window_prefix_sharing_reaches_the_router():
    """On a window of the real Mooncake trace, whose requests re-send shared blocks, the prefix-aware router serves
    more prompt tokens from cache than round-robin; every request finishes and every block is free again."""
    from minengine.workloads import find_data_dir, load_mooncake_trace, mooncake_path

    path = mooncake_path(find_data_dir())
    if path is None:
        pytest.skip("the Mooncake trace is not in ../shared/data")
    trace = load_mooncake_trace(path, max_requests=300, vocab_size=LLAMA_3_8B.vocab_size)
    results = {}
    for router in ("round-robin", "prefix-aware"):
        sim = FleetSimulator(FleetConfig.colocated(4, router=router), trace)
        results[router] = sim.run()
        assert len(results[router].request_metrics) == len(trace)
        for replica in sim.replicas:
            assert replica.engine.kv_cache_manager.num_free_blocks == replica.num_kv_blocks
    assert results["prefix-aware"].prefix_hit_rate > results["round-robin"].prefix_hit_rate > 0


# ---- the fleet's KV store (Mooncake Store) -----------------------------------------------------------------------
BS = 16
BLOCK_BYTES = BS * LLAMA_3_8B.kv_bytes_per_token  # 2 MiB per block of Llama-3-8B


def make_store(dram_blocks: int, ssd_blocks: int = 0, replica_gpus=(1,), gpus_per_node: int = 8, **fields):
    cfg = KVStoreConfig(dram_bytes_per_node=dram_blocks * BLOCK_BYTES, ssd_bytes_per_node=ssd_blocks * BLOCK_BYTES,
                        gpus_per_node=gpus_per_node, **fields)
    return KVStore(cfg, BS, BLOCK_BYTES, list(replica_gpus), [64e9] * len(replica_gpus))


class ReferenceLRU:
    """The eviction rule written the plainest way: per node, a DRAM list and an SSD list, least recent first."""

    def __init__(self, num_nodes: int, dram: int, ssd: int):
        self.dram = [[] for _ in range(num_nodes)]
        self.ssd = [[] for _ in range(num_nodes)]
        self.cap, self.ssd_cap = dram, ssd

    def node_of(self, h):
        for n in range(len(self.dram)):
            if h in self.dram[n] or h in self.ssd[n]:
                return n
        return None

    def insert(self, node, h):
        self.dram[node].append(h)
        if len(self.dram[node]) > self.cap:
            victim = self.dram[node].pop(0)
            if self.ssd_cap:
                self.ssd[node].append(victim)
                if len(self.ssd[node]) > self.ssd_cap:
                    self.ssd[node].pop(0)

    def use(self, h):
        node = self.node_of(h)
        if h in self.ssd[node]:
            self.ssd[node].remove(h)
            self.insert(node, h)
        else:
            self.dram[node].remove(h)
            self.dram[node].append(h)


store_ops = st.lists(st.tuples(st.sampled_from(["write", "load"]), st.integers(0, 2),
                               st.lists(st.integers(0, 11), min_size=1, max_size=5)), min_size=1, max_size=40)


@settings(max_examples=80, deadline=None)
@given(ops=store_ops, dram=st.integers(1, 4), ssd=st.integers(0, 3), gpus_per_node=st.integers(1, 3))
def test_store_capacity_and_lru_order_match_a_reference(ops, dram, ssd, gpus_per_node):
    """Random writes and loads from 3 replicas: after every operation each node holds exactly what a plain LRU
    list model holds, in the same order, and never more than its DRAM / SSD capacity."""
    store = make_store(dram, ssd, replica_gpus=(1, 1, 1), gpus_per_node=gpus_per_node)
    ref = ReferenceLRU(store.num_nodes, dram, ssd)
    keys = [bytes([k]) * 32 for k in range(12)]
    t = 0.0
    for kind, replica, ids in ops:
        t += 1.0
        hashes = [keys[i] for i in dict.fromkeys(ids)]
        if kind == "write":
            store.write(replica, hashes, t)
            store.advance(t + 0.5)  # the write has landed
            new = []
            for h in reversed(hashes):  # tail first; stored blocks are refreshed at once, new ones when written
                if ref.node_of(h) is None:
                    new.append(h)
                else:
                    ref.use(h)
            for h in new:
                if ref.node_of(h) is None:
                    ref.insert(store.replica_node[replica], h)
                else:
                    ref.use(h)
        else:
            plan = store.plan_load(replica, hashes, 0, len(hashes), t)
            n = 0 if plan is None else plan.num_blocks
            expected = 0
            while expected < len(hashes) and ref.node_of(hashes[expected]) is not None:
                expected += 1
            assert n == expected  # the stored chain from block 0
            if plan is not None:
                store.start_load(plan, t)
                store.load_done()
                for h in reversed(hashes[:n]):
                    ref.use(h)
        for node in range(store.num_nodes):
            assert store.node_blocks(node, DRAM) == ref.dram[node]
            assert store.node_blocks(node, SSD) == ref.ssd[node]
            assert len(ref.dram[node]) <= dram and len(ref.ssd[node]) <= ssd
        assert len(store) == sum(map(len, ref.dram + ref.ssd))
        assert store.num_dram == sum(map(len, ref.dram)) and store.num_ssd == sum(map(len, ref.ssd))


@settings(max_examples=40, deadline=None)
@given(prompts=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 70), st.integers(1, 60)), min_size=1,
                        max_size=12))
def test_store_chain_lookup_equals_the_engines_prefix_cache(prompts):
    """Prompts of 4 families (a shared head of up to 70 tokens, then their own tail), computed one after another:
    the store's hit for each prompt equals the engine's prefix-cache hit (``KVCacheManager.get_computed_blocks``,
    at most (len - 1) // block_size blocks) and the infinite-cache ideal counts the same tokens."""
    kv = KVCacheManager(num_blocks=10_000, block_size=BS, enable_prefix_caching=True)
    store = make_store(10_000)
    trace, store_hits = [], 0
    for i, (family, head, tail) in enumerate(prompts):
        ids = [100 + family] * head + [5000 + i * 100 + k for k in range(tail)]
        req = Request(f"r{i}", ids, SamplingParams(temperature=0, max_tokens=1), 0.0)
        blocks, num_hit = kv.get_computed_blocks(req)
        hashes = prompt_block_hashes(ids, BS)
        assert store.prefix_blocks(hashes, 0, (len(ids) - 1) // BS, float(i)) * BS == num_hit
        store_hits += num_hit
        trace.append(TraceRequest(float(i), len(ids), 1, ids, f"r{i}"))
        kv.allocate_slots(req, len(ids) - num_hit, blocks)  # "compute" it, index its blocks, free it
        kv.stage_full_blocks(req, len(ids))
        kv.commit_staged()
        kv.free(req)
        store.write(0, hashes, float(i))
        store.advance(i + 0.5)
    assert infinite_cache_hits(trace, BS).hit_tokens == store_hits


def conversations(n_conv: int, turns: int, seed: int = 0, rate: float = 4.0, first: int = 600, grow: int = 300,
                  output: int = 20) -> Trace:
    """Multi-turn chats: turn k of a conversation re-sends turns 1..k-1 and adds ``grow`` tokens; conversations
    interleave (Poisson arrivals), so a turn's replica under round-robin is rarely its predecessor's."""
    rng = random.Random(seed)
    starts = sorted(rng.uniform(0, n_conv / rate) for _ in range(n_conv))
    reqs = []
    for c, t0 in enumerate(starts):
        ids = [rng.randrange(3, 100_000) for _ in range(first)]
        t = t0
        for k in range(turns):
            reqs.append(TraceRequest(t, len(ids), output, list(ids), f"c{c}-t{k}"))
            ids = ids + [rng.randrange(3, 100_000) for _ in range(grow)]
            t += rng.uniform(2.0, 6.0)
    reqs.sort(key=lambda r: r.arrival_time)
    return Trace(reqs, source=f"conversations(seed={seed})")


def mean_ttft(result) -> float:
    return sum(m.ttft for m in result.request_metrics.values()) / len(result.request_metrics)


def test_store_serves_what_per_replica_caches_miss():
    """Multi-turn chats on 4 replicas under round-robin: per-replica caches hit only when a turn lands where its
    predecessor ran; with the store every replica can load the history, so the fleet's hit share rises towards the
    infinite-cache ideal (never above it), and the mean and P99 TTFT fall. Loads and writes are counted."""
    trace = conversations(24, 5, seed=11)
    ideal = infinite_cache_hits(trace, BS).hit_rate
    cfg = dict(replicas=(ReplicaSpec(num_kv_blocks=4000),) * 4, router="round-robin")
    alone = simulate(trace, FleetConfig(**cfg))
    shared = simulate(trace, FleetConfig(kv_store=KVStoreConfig(), **cfg))
    assert alone.store is None and alone.store_hit_rate == 0
    assert alone.prefix_hit_rate < 0.6 * ideal
    assert 0.9 * ideal <= shared.prefix_hit_rate <= ideal
    assert shared.store_hit_rate > 0 and shared.store.num_loads > 0
    st_ = shared.store
    assert st_.loaded_bytes == st_.loaded_blocks * BLOCK_BYTES and st_.written_bytes == st_.written_blocks * BLOCK_BYTES
    assert st_.used_blocks + st_.wasted_blocks == st_.loaded_blocks
    assert shared.bytes_moved == st_.loaded_bytes + st_.written_bytes > 0
    assert mean_ttft(shared) < mean_ttft(alone)
    assert shared.latency("ttft", 99) < alone.latency("ttft", 99)
    assert "KV store" in shared.describe() and "KV store" in shared.config.describe()


def test_a_load_is_a_prefix_hit_after_link_time():
    """Two replicas on two nodes: A computes a 20-block prompt on replica 0 and writes it to its node; B (the same
    prompt + more) goes to replica 1, loads the 20 blocks over InfiniBand (latency + bytes / 50 GB/s) and its engine
    admits it with those blocks as a prefix hit: its TTFT is the load plus the prefill of the rest on the clock."""
    a_ids = list(range(1000, 1320))
    b_ids = a_ids + list(range(5000, 5100))
    trace = Trace([TraceRequest(0.0, len(a_ids), 2, a_ids, "A"), TraceRequest(5.0, len(b_ids), 2, b_ids, "B")])
    store = KVStoreConfig(gpus_per_node=1)
    sim = FleetSimulator(FleetConfig(replicas=(ReplicaSpec(num_kv_blocks=400),) * 2, kv_store=store), trace)
    result = sim.run()
    assert result.assignments["B"][0] == 1
    m = result.request_metrics["B"]
    assert m.num_cached_tokens == 20 * BS
    load = LINKS["ib-400g"].transfer_time(20 * BLOCK_BYTES)
    model = StepCostModel("h100", "llama-3-8b")
    prefill = model.cost(StepWork.of([(len(b_ids) - 20 * BS, 20 * BS, 1)])).time_s
    assert m.ttft == pytest.approx(load + prefill, rel=1e-9)
    s = result.store
    assert (s.num_loads, s.loaded_blocks, s.remote_blocks, s.used_blocks, s.wasted_blocks) == (1, 20, 20, 20, 0)
    assert s.written_blocks == 20 + len(b_ids) // BS - 20  # A's blocks, then B's own new ones
    assert s.load_time_s == pytest.approx(load)
    # the same on one node: the load crosses the GPU's host link (PCIe, 64 GB/s) instead
    local = simulate(trace, FleetConfig(replicas=(ReplicaSpec(num_kv_blocks=400),) * 2, kv_store=KVStoreConfig()))
    assert local.store.remote_blocks == 0
    assert local.request_metrics["B"].ttft == pytest.approx(20 * BLOCK_BYTES / 64e9 + prefill, rel=1e-9)


def test_loads_only_when_cheaper_than_recomputing():
    """Over a link so slow that every load would take longer than recomputing, the store declines them all and
    the run is request for request the run without a store (writes cost no GPU time); over a fast link it loads,
    and each load it started ended before the recompute would have (checked from its counters)."""
    trace = conversations(10, 4, seed=12)
    cfg = dict(replicas=(ReplicaSpec(num_kv_blocks=3000),) * 3, router="round-robin")
    slow_link = KVLink("slow", 1e8)  # 0.1 GB/s: 2 MiB blocks take 21 ms each, far more than their prefill
    slow = simulate(trace, FleetConfig(kv_store=KVStoreConfig(gpus_per_node=1, link=slow_link), **cfg))
    alone = simulate(trace, FleetConfig(**cfg))
    assert slow.store.num_loads == 0 and slow.store.declined_loads > 0
    assert slow.request_metrics == alone.request_metrics
    fast = simulate(trace, FleetConfig(kv_store=KVStoreConfig(gpus_per_node=1), **cfg))
    assert fast.store.num_loads > 0
    model = StepCostModel("h100", "llama-3-8b")
    per_block_recompute = model.cost(StepWork.of([(BS, 0, 0)])).compute_time_s  # the cheapest a block can be
    assert fast.store.load_time_s / fast.store.loaded_blocks < 2048 / BS * per_block_recompute


def test_ssd_tier_keeps_what_dram_evicts():
    """A store whose DRAM holds 30 blocks per node forgets the early turns; with an SSD tier it keeps them, serves
    more from the store, and the loads that read SSD are counted (and slower: they wait on the SSD's bandwidth)."""
    trace = conversations(12, 4, seed=13)
    cfg = dict(replicas=(ReplicaSpec(num_kv_blocks=3000),) * 3, router="round-robin")
    dram = simulate(trace, FleetConfig(kv_store=KVStoreConfig(dram_bytes_per_node=30 * BLOCK_BYTES), **cfg))
    ssd = simulate(trace, FleetConfig(kv_store=KVStoreConfig(dram_bytes_per_node=30 * BLOCK_BYTES,
                                                             ssd_bytes_per_node=2000 * BLOCK_BYTES), **cfg))
    assert dram.store.dropped_blocks > 0 and dram.store.ssd_blocks == 0
    assert ssd.store.demoted_blocks > 0 and ssd.store.ssd_blocks > 0 and ssd.store.dropped_blocks == 0
    assert ssd.store_hit_rate > dram.store_hit_rate
    assert ssd.store.peak_dram_blocks <= 30 and ssd.store.peak_ssd_blocks <= 2000
    store = make_store(1, 4)
    store.write(0, [b"a" * 32], 0.0)
    store.write(0, [b"b" * 32], 1.0)  # pushes "a" to SSD
    store.advance(2.0)
    assert store.tier_of(b"a" * 32) == (0, SSD)
    seconds, remote, on_ssd = store.load_seconds(0, [b"a" * 32, b"b" * 32])
    assert (remote, on_ssd) == (0, 1)
    assert seconds == pytest.approx(BLOCK_BYTES / 7e9 + BLOCK_BYTES / 64e9 + 100e-6)


def test_conductor_scores_local_hit_plus_store_hit_minus_queue():
    """The conductor's estimate, by hand: queue x seconds per prefill token + the prefill of what is not cached,
    or the load of the stored part (overlapping the queue) + the prefill of the rest; the smallest wins, ties go to
    the least outstanding tokens."""
    from minengine.fleet.routers import Conductor

    trace = conversations(8, 4, seed=14)
    sim = FleetSimulator(FleetConfig(replicas=(ReplicaSpec(num_kv_blocks=3000),) * 3, router="conductor",
                                     kv_store=KVStoreConfig(gpus_per_node=1)), trace)
    result = sim.run()
    assert result.router_counts["num_by_store"] >= 0 and len(result.request_metrics) == len(trace)
    replica = sim.replicas[0]
    req = sim.requests[-1]
    req.release()  # its hashes again, from the trace's ids
    req.token_ids = trace[req.index].prompt_token_ids
    conductor = Conductor()
    t, by_load = conductor.estimate(req, replica, now=1e6)
    local = replica.local_prefix_blocks(req)
    stored = replica.store_prefix_blocks(req, local, 1e6)
    p = req.prompt_len
    compute = replica.prefill_time_s(p - local * BS, local * BS)  # nothing queued at the end
    assert replica.queued_prefill_tokens == 0
    if stored:
        load = replica.load_seconds(req, local, local + stored, 1e6)
        alt = load + replica.prefill_time_s(p - (local + stored) * BS, (local + stored) * BS)
        assert t == min(compute, alt) and by_load == (alt < compute)
    else:
        assert t == compute and not by_load
    # no cache anywhere, idle replicas: the one with the fewest outstanding tokens
    fresh = FleetSimulator(FleetConfig(replicas=(ReplicaSpec(num_kv_blocks=300),) * 3, router="conductor"),
                           Trace([TraceRequest(0.0, 50, 5, None, "x")]))
    fresh.replicas[0].outstanding_tokens = 10
    assert conductor.select(fresh.requests[0], fresh.replicas) is fresh.replicas[1]


def test_prefill_time_is_the_cost_models_chunks():
    replica = FleetSimulator(FleetConfig.colocated(1, max_num_batched_tokens=512), Trace([])).replicas[0]
    model = StepCostModel("h100", "llama-3-8b")
    expected = sum(model.cost(StepWork.of([(n, c, 0)])).time_s for n, c in ((512, 100), (512, 612), (76, 1124)))
    assert replica.prefill_time_s(1100, 100) == pytest.approx(expected, rel=1e-12)
    assert replica.prefill_time_s(0, 100) == 0.0
    assert replica.prefill_seconds_per_token == pytest.approx(model.cost(StepWork.of([(512, 0, 0)])).time_s / 512)


@pytest.mark.parametrize("fields,match", [
    (dict(dram_bytes_per_node=0), "dram_bytes_per_node"), (dict(ssd_bytes_per_node=-1), "ssd_bytes_per_node"),
    (dict(gpus_per_node=0), "gpus_per_node"), (dict(link="carrier-pigeon"), "KV link"),
    (dict(ssd_bandwidth=math.inf), "ssd_bandwidth"), (dict(local_bandwidth=0), "local_bandwidth"),
])
def test_store_config_rejects_bad_values(fields, match):
    with pytest.raises(ValueError, match=match):
        KVStoreConfig(**fields)


def test_fleet_config_with_a_store_needs_prefix_caching():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        FleetConfig(kv_store=KVStoreConfig(), enable_prefix_caching=False)
    with pytest.raises(ValueError, match="kv_store"):
        FleetConfig(kv_store={"dram_bytes_per_node": 1e12})
    with pytest.raises(ValueError, match="holds no block"):
        FleetSimulator(FleetConfig(kv_store=KVStoreConfig(dram_bytes_per_node=1e6)), Trace([]))


def test_store_lanes_and_prompt_sources_figures():
    """With a store (DRAM + SSD): the KV lanes end with the store's DRAM and SSD use (% of all nodes' capacity), the
    queue lanes with its loads in flight; the sources figure stacks local + store + computed to 100 % per run."""
    from minengine.viz.fleet_figures import fleet_lanes_figure, prompt_sources_figure

    trace = conversations(10, 4, seed=15)
    store = KVStoreConfig(dram_bytes_per_node=40 * BLOCK_BYTES, ssd_bytes_per_node=400 * BLOCK_BYTES)
    cfg = dict(replicas=(ReplicaSpec(num_kv_blocks=3000),) * 3, timeline_interval_s=0.0)
    shared = simulate(trace, FleetConfig(kv_store=store, **cfg))
    alone = simulate(trace, FleetConfig(**cfg))
    kv = fleet_lanes_figure(shared, "kv", num_bins=40).data[0]
    assert list(kv.y) == ["R0", "R1", "R2", "store", "store SSD"]
    assert max(kv.z[3]) == pytest.approx(100.0)  # the DRAM tier fills up (it is small), and never passes 100 %
    assert all(0 <= v <= 100 for row in kv.z for v in row) and max(kv.z[4]) > 0
    queue = fleet_lanes_figure(shared, "queue", num_bins=40).data[0]
    assert list(queue.y)[-1] == "store loads" and max(queue.z[-1]) >= 1
    assert list(fleet_lanes_figure(alone, "kv", num_bins=40).data[0].y) == ["R0", "R1", "R2"]
    ideal = infinite_cache_hits(trace, BS).hit_rate
    fig = prompt_sources_figure({"alone": alone, "store": shared}, ideal)
    local, loaded, computed = (bar.y for bar in fig.data)
    assert loaded[0] == 0 and loaded[1] == pytest.approx(100 * shared.store_hit_rate) and loaded[1] > 0
    for i in range(2):
        assert local[i] + loaded[i] + computed[i] == pytest.approx(100.0)
    assert fig.layout.shapes[0].y0 == pytest.approx(100 * ideal)
