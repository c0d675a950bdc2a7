"""Online replay through the real engine (the random tiny Llama): virtual and wall clocks, arrival order, no
leaked blocks, real prefix hits from Mooncake hash ids, clipping, and the capacity search."""

from __future__ import annotations

import json
import time

import pytest
import torch

from minengine.config import EngineConfig
from minengine.engine.llm_engine import LLMEngine
from minengine.workloads import (
    SLO,
    Trace,
    TraceRequest,
    VirtualClock,
    find_capacity,
    find_data_dir,
    load_azure_trace,
    load_mooncake_trace,
    parse_mooncake_jsonl,
    replay,
    replay_trace,
    synthetic_trace,
)
from minengine.workloads.traces import azure_conv_path, mooncake_path

torch.set_num_threads(1)
DATA = find_data_dir()


class CountingTimer:
    """A deterministic stand-in for ``time.perf_counter``: each call is ``tick`` seconds after the last, so a
    virtual-clock replay costs the same virtual time on every run (no measurement noise)."""

    def __init__(self, tick: float):
        self.tick, self.t = tick, 0.0

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def _config(model: str, **kw) -> EngineConfig:
    fields = dict(model=model, block_size=16, num_kv_blocks=96, max_num_batched_tokens=64, max_num_seqs=8,
                  max_model_len=512)
    fields.update(kw)
    return EngineConfig(**fields)


def _assert_no_leaks(engine: LLMEngine) -> None:
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    assert all(c == 0 for c in engine.kv_cache_manager.pool.ref_counts())


# ---- the clock -----------------------------------------------------------------------------------------------
def test_virtual_clock_runs_only_while_resumed():
    timer = CountingTimer(1.0)
    clock = VirtualClock(start=10.0, timer=timer)
    assert clock() == clock() == 10.0  # paused: time stands still, whatever the timer does
    with clock.running():
        assert clock() == 11.0 and clock() == 12.0
    assert clock() == 13.0 and not clock.is_running  # pause() read the timer once more
    clock.advance_to(100.0)
    clock.advance_to(50.0)  # the past: no-op
    assert clock() == 100.0
    clock.resume()
    with pytest.raises(ValueError, match="paused"):
        clock.advance_to(200.0)
    clock.pause()
    half = VirtualClock(timer=CountingTimer(1.0), step_time_scale=0.5)
    with half.running():
        assert half() == 0.5
    with pytest.raises(ValueError, match="step_time_scale"):
        VirtualClock(step_time_scale=0)


# ---- virtual-clock replays -----------------------------------------------------------------------------------
def test_virtual_replay_keeps_arrival_order_and_finishes_everything(random_llama):
    trace = synthetic_trace(16, rate=40.0, prompt_len=40, output_len=6, range_ratio=0.5, seed=1)
    engine = LLMEngine(_config(random_llama), clock=VirtualClock())
    result = replay(engine, trace)
    assert result.virtual_clock and result.all_finished
    ids = [r.request_id for r in trace]
    for r in trace:
        m = result.request_metrics[r.request_id]
        assert m.arrival_time == pytest.approx(result.start_time + r.arrival_time)
        assert m.first_scheduled_time >= m.arrival_time and m.first_token_time >= m.first_scheduled_time
        assert len(result.output_token_ids[r.request_id]) == r.output_len  # ignore_eos: lengths follow the trace
        assert result.finish_reasons[r.request_id] == "length"
    admitted = [rid for s in result.steps for rid in s.admitted_ids]
    first_admissions = list(dict.fromkeys(admitted))
    assert first_admissions == ids  # first come, first served: admitted in arrival order
    _assert_no_leaks(engine)
    # time advanced by the steps and jumped over idle gaps: each step starts after the previous one ended
    assert all(b.start_time >= a.end_time for a, b in zip(result.steps[:-1], result.steps[1:]))
    assert result.summary().num_requests == 16


def test_virtual_clock_jumps_over_idle_gaps(random_llama):
    trace = Trace([TraceRequest(0.0, 20, 4, None, "a"), TraceRequest(3600.0, 20, 4, None, "b")], source="gap")
    started = time.perf_counter()
    result = replay_trace(trace, _config(random_llama))
    assert time.perf_counter() - started < 60  # an hour of trace, no waiting
    b = result.request_metrics["b"]
    assert b.arrival_time - result.start_time == pytest.approx(3600.0)
    assert b.ttft < 5.0  # served as it arrived into an idle engine
    assert result.request_metrics["a"].finished_time < b.arrival_time


def test_virtual_replay_is_load_sensitive_and_deterministic(random_llama):
    """Same requests, all at once vs spread out: queueing shows in TTFT; with a deterministic timer the same
    replay gives the same numbers twice."""
    base = synthetic_trace(12, rate=1.0, prompt_len=48, output_len=8, seed=5)

    def run(rate_trace):
        return replay_trace(rate_trace, _config(random_llama), timer=CountingTimer(0.01))

    burst = run(Trace([TraceRequest(0.0, r.prompt_len, r.output_len, None, r.request_id) for r in base]))
    spread = run(base)
    again = run(base)
    assert burst.summary().ttft_p50 > 2 * spread.summary().ttft_p50
    assert [m.ttft for m in spread.request_metrics.values()] == [m.ttft for m in again.request_metrics.values()]


def test_mooncake_hash_ids_give_real_prefix_hits(random_llama):
    shared = [{"timestamp": i * 500, "input_length": 1500, "output_length": 32, "hash_ids": [1, 2, 3 + i]}
              for i in range(4)]
    disjoint = [dict(d, hash_ids=[10 * i + 1, 10 * i + 2, 10 * i + 3]) for i, d in enumerate(shared)]

    def run(lines):
        text = "\n".join(json.dumps(d) for d in lines)
        trace = parse_mooncake_jsonl(text, length_scale=1 / 16, block_size=16, vocab_size=512)
        engine = LLMEngine(_config(random_llama), clock=VirtualClock())
        result = replay(engine, trace)
        _assert_no_leaks(engine)
        return result

    hit = run(shared)
    s = hit.summary()
    assert hit.all_finished and s.prefix_hit_tokens > 0
    # requests 1..3 find the 2 shared hash blocks (64 tokens = 4 KV blocks) in the cache
    assert [hit.request_metrics[f"mooncake-{i}"].num_cached_tokens for i in range(4)] == [0, 64, 64, 64]
    miss = run(disjoint)
    assert miss.summary().prefix_hit_tokens == 0
    assert all(m.num_cached_tokens == 0 for m in miss.request_metrics.values())


@pytest.mark.skipif(mooncake_path(DATA) is None, reason="shared/data Mooncake trace absent")
def test_real_mooncake_window_hits_the_prefix_cache(random_llama):
    # requests 57-61 of the file: 61 (at 17.317 s) shares 28 leading hash blocks with 57 (16.669 s)
    trace = load_mooncake_trace(mooncake_path(DATA), start_s=16.6, end_s=17.4, length_scale=1 / 32,
                                block_size=16, vocab_size=512)
    assert [r.request_id for r in trace][0] == "mooncake-57" and "mooncake-61" in [r.request_id for r in trace]
    engine = LLMEngine(_config(random_llama, num_kv_blocks=256, max_model_len=1024, max_num_batched_tokens=256),
                       clock=VirtualClock())
    result = replay(engine, trace)
    assert result.all_finished
    assert result.request_metrics["mooncake-61"].num_cached_tokens >= 27 * 16
    _assert_no_leaks(engine)


@pytest.mark.skipif(azure_conv_path(DATA) is None, reason="shared/data Azure trace absent")
def test_real_azure_replay(random_llama):
    trace = load_azure_trace(azure_conv_path(DATA), max_requests=12, length_scale=1 / 16)
    engine = LLMEngine(_config(random_llama), clock=VirtualClock())
    result = replay(engine, trace)
    assert result.all_finished and result.num_clipped == 0
    assert {rid: len(t) for rid, t in result.output_token_ids.items()} == {r.request_id: r.output_len for r in trace}
    assert result.steps[-1].end_time - result.start_time >= trace[-1].arrival_time  # the trace's span is kept
    _assert_no_leaks(engine)


# ---- wall clock, limits, errors ------------------------------------------------------------------------------
def test_wall_clock_replay_waits_for_arrivals(random_llama):
    trace = Trace([TraceRequest(0.0, 12, 2, None, "a"), TraceRequest(0.3, 12, 2, None, "b")])
    engine = LLMEngine(_config(random_llama))  # time.perf_counter
    started = time.perf_counter()
    result = replay(engine, trace)
    assert not result.virtual_clock and result.all_finished
    assert time.perf_counter() - started >= 0.3
    b = result.request_metrics["b"]
    assert b.first_scheduled_time - result.start_time >= 0.3 - 1e-3  # not scheduled before it arrived


def test_too_long_requests_clip_skip_or_error(random_llama):
    trace = Trace([TraceRequest(0.0, 300, 10, None, "long"), TraceRequest(0.0, 20, 4, None, "short")])
    cfg = dict(max_model_len=128)
    clipped = replay_trace(trace, _config(random_llama, **cfg))
    assert clipped.num_clipped == 1 and clipped.request_metrics["long"].num_prompt_tokens == 118
    assert len(clipped.output_token_ids["long"]) == 10
    skipped = replay_trace(trace, _config(random_llama, **cfg), too_long="skip")
    assert skipped.skipped_ids == ["long"] and list(skipped.request_metrics) == ["short"]
    with pytest.raises(ValueError, match="long"):
        replay_trace(trace, _config(random_llama, **cfg), too_long="error")
    with pytest.raises(ValueError, match="too_long"):
        replay_trace(trace, _config(random_llama), too_long="drop")


def test_out_of_vocabulary_ids_are_rejected(random_llama):
    text = json.dumps({"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1]})
    trace = parse_mooncake_jsonl(text, vocab_size=100_000)
    if all(t < 512 for t in trace[0].prompt_token_ids):
        pytest.skip("all synthetic ids happened to fall in the small vocabulary")
    with pytest.raises(ValueError, match="vocab_size=512"):
        replay_trace(trace, _config(random_llama))


# ---- capacity ------------------------------------------------------------------------------------------------
def test_capacity_search_is_monotone_in_the_slo(random_llama):
    """A looser TTFT SLO never gives a lower capacity (same seeded arrivals, deterministic step times), and the
    rate found passes while a clearly higher one failed (or, for the loose one, the maximum throughput bounds it)."""
    cfg = _config(random_llama)
    kwargs = dict(num_requests=12, start_rate=20.0, rel_tol=0.25, max_probes=6, seed=0, min_attainment=0.9)
    found = []
    for ttft_ms in (5, 60):
        res = find_capacity(SLO(ttft_s=ttft_ms / 1000), cfg, timer=CountingTimer(0.001), **kwargs)
        passed = [p.rate for p in res.probes if p.passed]
        failed = [p.rate for p in res.probes if not p.passed]
        assert res.capacity == (max(passed) if passed else 0.0) <= res.max_throughput
        # bracketed from above by a failing rate, or every rate up to the maximum throughput passed
        assert (failed and min(failed) > res.capacity) or res.bound == "throughput", res.probes
        found.append(res)
    assert found[0].bound == "slo"  # the tight SLO binds below the engine's throughput
    assert 0 < found[0].capacity <= found[1].capacity


# ---- the command line ----------------------------------------------------------------------------------------
def test_bench_serve_prints_the_serving_table(random_llama, capsys, tmp_path):
    from minengine.__main__ import main

    out_json = tmp_path / "result.json"
    main(["bench-serve", "--model", random_llama, "--trace", "poisson", "--num-requests", "6", "--request-rate",
          "50", "--input-len", "24", "--output-len", "4", "--num-kv-blocks", "64", "--max-model-len", "256",
          "--slo-ttft-ms", "1000", "--slo-tbt-ms", "1000", "--result-json", str(out_json)])
    text = capsys.readouterr().out
    for label in ("Serving Benchmark Result", "Successful requests:                    6", "Request goodput (req/s):",
                  "Mean TTFT (ms):", "Median TPOT (ms):", "P99 ITL (ms):", "P99 E2EL (ms):", "prefix hit rate"):
        assert label in text
    saved = json.loads(out_json.read_text())
    assert saved["benchmark"]["completed"] == 6 and saved["benchmark"]["total_output_tokens"] == 24
    with pytest.raises(SystemExit):
        main(["bench-serve", "--model", random_llama, "--trace", "poisson", "--capacity"])  # needs an SLO
