"""A served engine's history (step traces, finished requests' metrics) stays within ``max_history_bytes``: the
byte bound holds for any sequence of entry sizes, and a running ``AsyncLLMEngine`` keeps under it (measured
again from the engine) with aborted requests counted too."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minengine import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
from minengine.metrics.history import ByteBoundedFifo, entry_bytes
from minengine.outputs import RequestMetrics


@given(cap=st.integers(1, 10_000), sizes=st.lists(st.integers(1, 12_000), max_size=200))
def test_the_kept_total_never_exceeds_the_cap_and_the_newest_are_kept(cap, sizes):
    """After every push: the kept total <= cap; the kept entries are exactly the longest run of newest entries
    that fits (so the newest is kept whenever it fits alone); the dropped ones come back oldest first."""
    fifo = ByteBoundedFifo(cap)
    dropped_all = []
    for i, size in enumerate(sizes):
        dropped_all += fifo.push(i, size)
        assert fifo.total_bytes <= cap
        kept, total = [], 0
        for j in range(i, -1, -1):  # the longest suffix that fits
            if total + sizes[j] > cap:
                break
            total += sizes[j]
            kept.insert(0, j)
        assert fifo.keys() == kept and fifo.total_bytes == total
        assert (i in kept) == (size <= cap)
        assert dropped_all == list(range(len(dropped_all)))  # oldest first, each once
    assert fifo.num_dropped == len(dropped_all) == len(sizes) - len(fifo)


def test_a_bad_cap_is_refused():
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_history_bytes"):
            ByteBoundedFifo(bad)


def test_entry_bytes_grows_with_what_an_entry_holds():
    short, long = RequestMetrics(arrival_time=0.0), RequestMetrics(arrival_time=0.0)
    long.itls.extend(float(i) for i in range(1000))
    assert entry_bytes(long) - entry_bytes(short) >= 1000 * 8  # one float object and one pointer per token
    shared = [1.5] * 3
    assert entry_bytes([shared, shared]) < 2 * entry_bytes(shared) + 100  # each object once


@pytest.mark.parametrize("cap", [20_000, 200_000])
def test_a_running_server_keeps_its_history_under_the_cap(bundled_model, cap):
    """Requests (some aborted halfway) through an AsyncLLMEngine whose byte bound is small: the history measured
    again from the engine never exceeds it, yet keeps the newest step; aborted requests are counted too."""
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(
        model=bundled_model, max_model_len=256, num_kv_blocks=64, max_num_batched_tokens=64,
        max_history_bytes=cap))
    sizes = []

    async def one(i: int):
        params = SamplingParams(temperature=0, max_tokens=4 + i % 13, ignore_eos=True)
        async for _out in engine.generate("ROMEO:" * (1 + i % 5), params, f"r{i}"):
            if i % 7 == 3:
                await engine.abort(f"r{i}")
                break
        sizes.append(await engine.call(lambda e: engine.history.measured_bytes()))  # between two steps

    async def main():
        for batch in range(6):
            await asyncio.gather(*(one(10 * batch + k) for k in range(10)))

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
        e = engine.engine
        assert max(sizes) <= cap and engine.history.measured_bytes() <= cap
        assert e.traces and e.traces[-1].step == e.num_steps - 1
        assert engine.history.fifo.num_dropped > 0  # the bound was reached: it did the work
        finished = {rid: m for rid, m in e.request_metrics.items() if m.finished_time is not None}
        assert len(finished) < 60  # the oldest were dropped
        # every finished request still held is in the budget, aborted ones included
        assert all(engine.history.counted.get(rid) == m.finished_time for rid, m in finished.items())
        assert any(m.finish_reason == "abort" for m in finished.values()) or cap < 100_000  # room for a batch
    finally:
        engine.shutdown()


def test_server_memory_benchmark_quick(tmp_path):
    """``benchmarks/server_memory.py --quick``: a few hundred requests through the real server with a small cap;
    the budget fills (entries are dropped) and the history measured from the engine never exceeds the cap."""
    from benchmarks import server_memory

    result = server_memory.main(["--quick", "--clients", "4", "--json", str(tmp_path / "m.json")])
    cap = result["max_history_bytes"]
    assert result["num_requests"] == 300 and len(result["samples"]) >= 9
    assert all(r["history_bytes"] <= cap and r["history_budget_bytes"] <= cap for r in result["samples"])
    assert result["history_max_measured_bytes"] <= cap and result["samples"][-1]["entries_dropped"] > 0
    assert result["finished_bytes_per_output_token"] > 0 and result["trace_median_bytes"] > 0


def test_documented_costs_per_entry_are_what_entry_bytes_measures():
    """docs/server.md's cost of a finished request (bytes, and bytes per output token)."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text().split())  # unwrapped
    base, per_token = _doc_costs(text)
    m = RequestMetrics(arrival_time=0.0, finished_time=1.0, first_token_time=0.5, finish_reason="length")
    empty = entry_bytes(m)
    m.itls.extend(0.001 * i + 0.5 for i in range(1000))
    assert abs(empty - base) <= 0.15 * base  # the size of an instance's __dict__ varies a little
    assert abs((entry_bytes(m) - empty) / 1000 - per_token) <= 2


def _doc_costs(text: str) -> tuple[int, int]:
    import re

    match = re.search(r"finished request's metrics cost about ([\d.]+) KB plus (\d+) bytes per output token", text)
    assert match, "the cost sentence is gone from the doc"
    return round(float(match.group(1)) * 1000), int(match.group(2))


def test_documented_default_cap():
    from pathlib import Path

    from minengine.config import DEFAULT_MAX_HISTORY_BYTES

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text().split())  # unwrapped
    assert f"default {DEFAULT_MAX_HISTORY_BYTES // 2**20} MiB" in text
    table = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert f"| `max_history_bytes` | {DEFAULT_MAX_HISTORY_BYTES // 2**20} MiB |" in table
    assert "20,000 completions" in text and "300 requests with a 2 MiB cap" in text
    from benchmarks import server_memory

    source = Path(server_memory.__file__).read_text()
    assert 'default=20_000' in source and "a.num_requests, a.max_history_bytes, a.samples = 300, 2 * 2**20" in source


def test_reused_request_ids_do_not_grow_the_history(bundled_model):
    """A caller that reuses request ids: the engine moves the earlier request's metrics aside (its summary keeps
    both); those count against the budget too and are dropped oldest first."""
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(
        model=bundled_model, max_model_len=256, num_kv_blocks=64, max_history_bytes=30_000))

    async def main():
        for _ in range(40):
            async for _out in engine.generate("ROMEO:", SamplingParams(max_tokens=3), "same-id"):
                pass
        return await engine.call(lambda e: (len(e._past_metrics), engine.history.measured_bytes()))

    try:
        num_past, measured = asyncio.run(asyncio.wait_for(main(), 120))
        assert 0 < num_past < 39 and measured <= 30_000
    finally:
        engine.shutdown()


def test_the_committed_benchmark_run_is_what_the_page_says():
    """``docs/server.md`` quotes the committed ``benchmarks/results/server_memory.json``: its size, its RSS at the
    first and last samples, the slope over the last half and the largest history measured, all under the cap."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = json.loads((root / "benchmarks" / "results" / "server_memory.json").read_text())
    text = " ".join((root / "docs" / "server.md").read_text().split())
    assert run["history_max_measured_bytes"] <= run["max_history_bytes"]
    quoted = [f"{run['num_requests']:,} requests", f"{run['max_history_bytes'] // 2**20} MiB cap",
              f"{run['clients']} clients", f"{run['rss_first_mb']:.1f} MB to {run['rss_last_mb']:.1f} MB",
              f"{run['rss_slope_last_half_mb_per_1000']} MB per 1,000 requests",
              f"{run['history_max_measured_bytes']:,} bytes", f"(the cap: {run['max_history_bytes']:,})",
              f"1 to {run['max_tokens']} tokens"]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/server.md does not say {missing}"
