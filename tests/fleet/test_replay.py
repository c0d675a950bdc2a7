"""``minengine.fleet.replay``'s parts that need no running fleet: the text window, the request selection, the records'
statistics, where a request's prefix hit is read from, and the twin's configuration (the real fleet's replay is
tested in ``tests/server/test_fleet_replay.py``)."""

from __future__ import annotations

import pytest

from minengine.fleet.replay import (
    ReplayResult,
    RequestRecord,
    WindowRequest,
    admission_hits,
    prefill_spans,
    shared_prefix_requests,
    simulate_window,
    text_window,
    twin_config,
)
from minengine.metrics.trace import ScheduledChunk, StepTrace
from minengine.timing.hardware import get_hardware
from minengine.timing.model_shape import ModelShape
from minengine.workloads import TraceRequest


@pytest.fixture(scope="module")
def tokenizer(bundled_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model)


def test_text_window_keeps_shared_prefixes_and_stretches_arrivals(tokenizer):
    head = tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 4)
    trace = [TraceRequest(10.0, len(head) + 3, 40, head + tokenizer.encode(" It is"), request_id="a"),
             TraceRequest(12.5, len(head) + 3, 2, head + tokenizer.encode(" Juliet"), request_id="b")]
    window = text_window(trace[::-1], tokenizer, time_scale=4.0, max_tokens=16)
    assert [r.request_id for r in window] == ["a", "b"] and [r.arrival_s for r in window] == [0.0, 10.0]
    assert [r.max_tokens for r in window] == [16, 2]
    a, b = window
    assert a.prompt.startswith("ROMEO:") and a.prompt_token_ids == tokenizer.encode(a.prompt)
    shared = next(i for i, (x, y) in enumerate(zip(a.prompt_token_ids, b.prompt_token_ids)) if x != y)
    assert shared >= len(head) - 1  # the text keeps the shared head (its last token may merge differently)
    with pytest.raises(ValueError, match="has no prompt_token_ids"):
        text_window([TraceRequest(0.0, 5, 1, None, request_id="x")], tokenizer)
    with pytest.raises(ValueError, match="time_scale must be > 0"):
        text_window(trace, tokenizer, time_scale=0)


def test_shared_prefix_requests_keeps_the_most_resent_heads_in_arrival_order():
    def req(t, head, i):
        return TraceRequest(t, 4, 1, [head, head, 7, i], request_id=f"{head}-{i}")

    trace = [req(3, 1, 0), req(1, 2, 1), req(2, 2, 2), req(4, 3, 3), req(5, 1, 4), req(0, 2, 5), req(6, 3, 6)]
    chosen = shared_prefix_requests(trace, 2, 2)
    assert [r.request_id for r in chosen] == ["2-5", "2-1", "2-2", "1-0", "1-4"]  # head 2 (3x), then 1 (2x, seen
    assert [r.request_id for r in shared_prefix_requests(trace, 2, 2, max_requests=2)] == ["2-5", "2-1"]  # first)
    with pytest.raises(ValueError, match="num_prefixes and prefix_tokens must be >= 1"):
        shared_prefix_requests(trace, 0, 2)


def test_replay_result_statistics():
    recs = [RequestRecord(f"r{i}", i % 2, float(i), ttft, 100, cached, 4, ttft / 2)
            for i, (ttft, cached) in enumerate([(0.1, 0), (0.2, 50), (0.3, 96), (0.4, 0)])]
    result = ReplayResult(recs, 3)
    assert result.requests_per_replica() == [2, 2, 0]
    assert result.prefix_hit_rate == pytest.approx(146 / 400)
    assert result.ttft_percentile(50) == pytest.approx(0.25) and result.ttft_percentile(100) == pytest.approx(0.4)
    assert result.ttft_percentile(90) == pytest.approx(0.37)
    assert result.ttft_percentile(50, "prefill_s") == pytest.approx(0.125)
    with pytest.raises(ValueError, match="no requests"):
        ReplayResult([], 2).ttft_percentile(50)


def _step(step, chunks, admitted):
    return StepTrace(step=step, start_time=step * 0.01, end_time=step * 0.01 + 0.01, token_budget=64, chunks=chunks,
                     num_running=1, num_waiting=0, num_free_blocks=10, num_cached_free_blocks=0, num_total_blocks=16,
                     preempted_ids=[], admitted_ids=admitted, finished_ids=[], prefix_queried_tokens=0,
                     prefix_hit_tokens=0)


def test_admission_hits_and_prefill_spans_read_from_the_steps():
    steps = [_step(0, [ScheduledChunk("a", 32, 0, True, False)], ["a"]),
             _step(1, [ScheduledChunk("a", 8, 32, True, True), ScheduledChunk("b", 20, 48, True, True)], ["b"]),
             _step(2, [ScheduledChunk("b", 1, 68, False, True)], []),
             _step(3, [ScheduledChunk("b", 69, 0, True, True)], ["b"])]  # re-admitted after a preemption
    assert admission_hits(steps) == {"a": 0, "b": 48}
    assert prefill_spans(steps) == pytest.approx({"a": 0.02, "b": 0.01})  # a: steps 0-1 (chunked), b: step 1


def test_the_twin_takes_the_replicas_settings_and_runs_the_window(bundled_model):
    info = {"num_kv_blocks": 64, "max_num_batched_tokens": 256, "max_num_seqs": 8, "block_size": 16,
            "enable_chunked_prefill": True, "enable_prefix_caching": True, "max_model_len": 512,
            "scheduling_policy": "decode-first", "preemption_mode": "recompute"}
    shape = ModelShape.from_hf_config(bundled_model, dtype_bytes=4)
    hw = get_hardware("cpu")
    config = twin_config(info, hw, shape, 2, "cache-aware")
    assert len(config.replicas) == 2 and config.num_kv_blocks(config.replicas[0]) == 64
    assert (config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len) == (256, 8, 512)
    head = list(range(100, 164))
    window = [WindowRequest("a", 0.0, "", head + [1, 2], 3), WindowRequest("b", 5.0, "", head + [3], 2),
              WindowRequest("c", 5.5, "", list(range(400, 440)), 1)]
    result = simulate_window(window, config)
    assert [r.request_id for r in result.records] == ["a", "b", "c"]
    a, b, c = result.records
    assert a.replica == b.replica and b.cached_tokens == 64 and a.cached_tokens == 0  # the re-sent head hits
    assert [r.output_tokens for r in result.records] == [3, 2, 1] and all(r.ttft_s > 0 for r in result.records)
    assert all(0 < r.prefill_s <= r.ttft_s for r in result.records)
    with pytest.raises(ValueError, match="router must be one of"):
        twin_config(info, hw, shape, 2, "fastest")


def test_coroutines_run_from_inside_a_running_event_loop_as_in_a_notebook():
    import asyncio

    from minengine.fleet.replay import _run

    async def inside():  # a notebook's cell runs inside the kernel's event loop: asyncio.run would refuse
        return _run(asyncio.sleep(0, result=7))

    assert _run(asyncio.sleep(0, result=3)) == 3 and asyncio.run(inside()) == 7
