"""Trace parsers (inline text always, the real files when present), arrival processes, goodput and the capacity
bisection. No model is needed here (see test_replay.py for replays through the engine)."""

from __future__ import annotations

import json
import math

import pytest

from minengine.outputs import RequestMetrics
from minengine.workloads import (
    SLO,
    ServingBenchmark,
    Trace,
    azure_conv_path,
    find_data_dir,
    gamma_arrivals,
    goodput,
    inter_arrival_stats,
    load_azure_trace,
    load_mooncake_trace,
    meets_slo,
    mooncake_path,
    parse_azure_csv,
    parse_mooncake_jsonl,
    poisson_arrivals,
    search_highest_passing_rate,
    slo_attainment,
    speed_up,
    synthetic_prompt_ids,
    synthetic_trace,
    with_arrivals,
)
from minengine.workloads.traces import hash_block_token_ids, parse_azure_timestamp, tokens_per_hash_block

DATA = find_data_dir()
AZURE = azure_conv_path(DATA)
MOONCAKE = mooncake_path(DATA)
needs_azure = pytest.mark.skipif(AZURE is None, reason="shared/data Azure trace absent")
needs_mooncake = pytest.mark.skipif(MOONCAKE is None, reason="shared/data Mooncake trace absent")

AZURE_TEXT = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2000001,1000,7
2023-11-16 18:16:46.6805900,16,0
"""


# ---- Azure ---------------------------------------------------------------------------------------------------
def test_azure_inline_parse_keeps_7_digit_fractions():
    t = parse_azure_csv(AZURE_TEXT)
    assert isinstance(t, Trace) and isinstance(t, list) and len(t) == 4
    assert [r.request_id for r in t] == ["azure-0", "azure-1", "azure-2", "azure-3"]
    assert t[0].arrival_time == 0.0
    assert t[1].arrival_time == pytest.approx(4.3145790, abs=1e-6)
    assert t[2].arrival_time == pytest.approx(4.5194101, abs=1e-6)  # the 7th digit counts (100 ns)
    assert t[3].arrival_time == pytest.approx(60.0, abs=1e-6)
    assert [(r.prompt_len, r.output_len) for r in t] == [(374, 44), (396, 109), (1000, 7), (16, 1)]
    assert all(r.prompt_token_ids is None for r in t)
    assert t.length_scale == 1.0 and t.source == "<text>"


def test_azure_timestamp_formats():
    base = parse_azure_timestamp("2023-11-16 18:15:46")
    assert parse_azure_timestamp("2023-11-16 18:15:46.6805900") - base == pytest.approx(0.68059, abs=1e-7)
    assert parse_azure_timestamp("2023-11-16T18:15:46.5Z") - base == pytest.approx(0.5)
    assert parse_azure_timestamp("2023-11-16 19:15:46+01:00") == pytest.approx(base)


def test_azure_scale_window_and_max_requests():
    t = parse_azure_csv(AZURE_TEXT.encode(), length_scale=0.25)
    assert t.length_scale == 0.25
    assert [(r.prompt_len, r.output_len) for r in t] == [(94, 11), (99, 27), (250, 2), (4, 1)]  # rounded, >= 1
    w = parse_azure_csv(AZURE_TEXT, start_s=4.0, end_s=30.0)
    assert [r.request_id for r in w] == ["azure-1", "azure-2"]
    assert w[0].arrival_time == pytest.approx(0.3145790, abs=1e-6)  # counted from the window start
    assert w.time_offset_s == 4.0
    assert [r.request_id for r in parse_azure_csv(AZURE_TEXT, max_requests=2)] == ["azure-0", "azure-1"]
    assert isinstance(t[1:3], Trace) and t[1:3].length_scale == 0.25


def test_azure_unsorted_rows_are_sorted():
    lines = AZURE_TEXT.strip().splitlines()
    t = parse_azure_csv("\n".join([lines[0], lines[2], lines[1], lines[3], lines[4]]))
    assert [r.request_id for r in t] == ["azure-1", "azure-0", "azure-2", "azure-3"]
    assert [r.arrival_time for r in t] == sorted(r.arrival_time for r in t)


@pytest.mark.parametrize("text, match", [
    ("", "line 1"),
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n", "column 'GeneratedTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\n16/11/2023 18:15,3,4\n",
     "line 3: column 'TIMESTAMP'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,abc,4\n", "line 2: column 'ContextTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,-1\n", "line 2: column 'GeneratedTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,4\n", "line 2: column 'ContextTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3\n", "line 2: 2 fields"),
])
def test_azure_malformed_input_names_line_and_column(text, match):
    with pytest.raises(ValueError, match=match):
        parse_azure_csv(text)


@pytest.mark.parametrize("kwargs, match", [
    ({"length_scale": 0}, "length_scale"), ({"max_requests": 0}, "max_requests"),
    ({"start_s": 5, "end_s": 5}, "end_s"), ({"start_s": -1}, "start_s"),
])
def test_trace_options_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        parse_azure_csv(AZURE_TEXT, **kwargs)
    with pytest.raises(ValueError, match=match):
        parse_mooncake_jsonl(MOONCAKE_TEXT, **kwargs)


@needs_azure
def test_azure_real_file():
    t = load_azure_trace(AZURE)
    assert len(t) == 19366  # the data README's row count
    assert (t[0].prompt_len, t[0].output_len) == (374, 44)
    assert t[1].arrival_time == pytest.approx(4.3145790, abs=1e-6)
    assert t.duration_s == pytest.approx(3501.7, abs=0.1)
    rate, cv = inter_arrival_stats([r.arrival_time for r in t])
    assert rate == pytest.approx(5.53, abs=0.01) and cv == pytest.approx(1.09, abs=0.01)
    small = load_azure_trace(AZURE, max_requests=50, start_s=600, length_scale=1 / 16)
    assert len(small) == 50 and small.length_scale == 1 / 16 and small.source == str(AZURE)
    assert all(0 <= r.arrival_time and r.prompt_len >= 1 and r.output_len >= 1 for r in small)
    assert small[0].arrival_time < 5  # about one request per 0.2 s, counted from the window start


# ---- Mooncake ------------------------------------------------------------------------------------------------
MOONCAKE_TEXT = "\n".join(json.dumps(d) for d in [
    {"timestamp": 0, "input_length": 1100, "output_length": 32, "hash_ids": [7, 8, 9]},
    {"timestamp": 250, "input_length": 1300, "output_length": 16, "hash_ids": [7, 8, 10]},
    {"timestamp": 1250, "input_length": 100, "output_length": 1, "hash_ids": [11]},
]) + "\n"


def test_mooncake_inline_parse_and_shared_prefixes():
    t = parse_mooncake_jsonl(MOONCAKE_TEXT, length_scale=1 / 16, block_size=16, vocab_size=512)
    assert t.tokens_per_hash_block == 32 and t.length_scale == 1 / 16
    assert [r.arrival_time for r in t] == [0.0, 0.25, 1.25]  # milliseconds -> seconds
    assert [r.request_id for r in t] == ["mooncake-0", "mooncake-1", "mooncake-2"]
    # 2 full scaled blocks of 32 + the last block's 76 (resp. 276) of 512 tokens scaled to 32 per 512
    assert [r.prompt_len for r in t] == [64 + 5, 64 + 17, 6]
    assert [r.output_len for r in t] == [2, 1, 1]
    a, b, c = (r.prompt_token_ids for r in t)
    assert all(len(r.prompt_token_ids) == r.prompt_len for r in t)
    assert a[:64] == b[:64]  # equal leading hash ids -> equal leading tokens
    assert a[64:69] != b[64:69]  # hash 9 vs hash 10
    assert a[:6] != c and all(0 <= x < 512 for x in a + b + c)


def test_mooncake_token_synthesis_is_deterministic():
    one = parse_mooncake_jsonl(MOONCAKE_TEXT, length_scale=1 / 32, block_size=16, vocab_size=2048)
    two = parse_mooncake_jsonl(MOONCAKE_TEXT.encode(), length_scale=1 / 32, block_size=16, vocab_size=2048)
    assert [r.prompt_token_ids for r in one] == [r.prompt_token_ids for r in two]
    assert hash_block_token_ids(7, 16, 2048) == one[0].prompt_token_ids[:16]
    assert hash_block_token_ids(7, 16, 2048) != hash_block_token_ids(8, 16, 2048)
    assert synthetic_prompt_ids("azure-3", 20, 100) == synthetic_prompt_ids("azure-3", 20, 100)
    assert synthetic_prompt_ids("azure-3", 20, 100) != synthetic_prompt_ids("azure-4", 20, 100)


def test_tokens_per_hash_block_is_whole_kv_blocks():
    assert tokens_per_hash_block(1.0, 16) == 512
    assert tokens_per_hash_block(1 / 16, 16) == 32
    assert tokens_per_hash_block(1 / 100, 16) == 16  # never less than one KV block
    assert tokens_per_hash_block(1 / 10, 16) % 16 == 0


@pytest.mark.parametrize("line, match", [
    ('{"timestamp": 0, "input_length": 10, "output_length": 2', "line 2: not valid JSON"),
    ('[1, 2]', "line 2: expected a JSON object"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2}', "line 2: missing field 'hash_ids'"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]}', "line 2: field 'hash_ids' has 1"),
    ('{"timestamp": 0, "input_length": 10, "output_length": -2, "hash_ids": [1]}', "line 2: field 'output_length'"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 2, "hash_ids": [1]}', "line 2: field 'timestamp'"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": ["a"]}', "line 2: field 'hash_ids'"),
])
def test_mooncake_malformed_input_names_line_and_field(line, match):
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}'
    with pytest.raises(ValueError, match=match):
        parse_mooncake_jsonl(good + "\n" + line + "\n")


@needs_mooncake
def test_mooncake_real_file_keeps_prefix_structure():
    t = load_mooncake_trace(MOONCAKE, max_requests=80, length_scale=1 / 32, block_size=16, vocab_size=512)
    assert len(t) == 80 and t.tokens_per_hash_block == 16
    raw = [json.loads(line) for line in MOONCAKE.read_text().splitlines()[:80]]
    for i in range(80):  # every pair: shared leading hash ids <=> shared leading tokens, block by block
        for j in range(i):
            hi, hj = raw[i]["hash_ids"], raw[j]["hash_ids"]
            k = 0
            while k < min(len(hi), len(hj)) and hi[k] == hj[k]:
                k += 1
            full = min(k, len(hi) - 1, len(hj) - 1)  # shared blocks that are full in both requests
            ti, tj = t[i].prompt_token_ids, t[j].prompt_token_ids
            assert ti[:16 * full] == tj[:16 * full]
            if k < min(len(hi), len(hj)) and k < len(hi) - 1 and k < len(hj) - 1:
                assert ti[16 * k:16 * (k + 1)] != tj[16 * k:16 * (k + 1)]
    full_len = load_mooncake_trace(MOONCAKE, length_scale=1 / 16, vocab_size=512)
    assert len(full_len) == 3993 and full_len.duration_s == pytest.approx(1022.0, abs=0.1)


# ---- arrivals ------------------------------------------------------------------------------------------------
def test_poisson_rate_and_cv():
    times = poisson_arrivals(5.0, 4000, seed=3)
    rate, cv = inter_arrival_stats(times)
    assert times[0] == 0.0 and times == sorted(times)
    assert rate == pytest.approx(5.0, rel=0.06) and cv == pytest.approx(1.0, abs=0.06)
    assert poisson_arrivals(5.0, 100, seed=3) == times[:100]
    assert poisson_arrivals(5.0, 100, seed=4) != times[:100]
    # one seed, one pattern: twice the rate is the same arrivals at half the times
    assert poisson_arrivals(10.0, 100, seed=3) == pytest.approx([t / 2 for t in times[:100]])


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_rate_and_cv(cv):
    rate, measured_cv = inter_arrival_stats(gamma_arrivals(2.0, cv, 6000, seed=1))
    assert rate == pytest.approx(2.0, rel=0.1)
    assert measured_cv == pytest.approx(cv, rel=0.12)


def test_arrival_edge_cases_and_errors():
    assert poisson_arrivals(math.inf, 3) == [0.0, 0.0, 0.0]
    assert gamma_arrivals(1.0, 2.0, 0) == []
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="rate"):
            poisson_arrivals(bad, 3)
    with pytest.raises(ValueError, match="cv"):
        gamma_arrivals(1.0, 0.0, 3)
    with pytest.raises(ValueError, match="num_requests"):
        poisson_arrivals(1.0, -3)


def test_retiming_and_synthetic_trace():
    t = parse_azure_csv(AZURE_TEXT, length_scale=0.5)
    fast = speed_up(t, 4.0)
    assert [r.arrival_time for r in fast] == pytest.approx([r.arrival_time / 4 for r in t])
    assert fast.length_scale == 0.5 and [r.prompt_len for r in fast] == [r.prompt_len for r in t]
    re = with_arrivals(t, [0, 1, 2, 3])
    assert [r.arrival_time for r in re] == [0, 1, 2, 3] and [r.request_id for r in re] == [r.request_id for r in t]
    with pytest.raises(ValueError, match="arrival_times"):
        with_arrivals(t, [0, 1])
    with pytest.raises(ValueError, match="non-decreasing"):
        with_arrivals(t, [0, 2, 1, 3])
    s = synthetic_trace(200, rate=3.0, prompt_len=40, output_len=10, range_ratio=0.5, seed=2)
    assert len(s) == 200 and all(20 <= r.prompt_len <= 60 and 5 <= r.output_len <= 15 for r in s)
    assert len({r.prompt_len for r in s}) > 5
    with pytest.raises(ValueError, match="range_ratio"):
        synthetic_trace(3, 1.0, range_ratio=1.0)


# ---- goodput -------------------------------------------------------------------------------------------------
def _metrics(arrival, ttft, itls, finished=True) -> RequestMetrics:
    first = arrival + ttft
    end = first + sum(itls)
    return RequestMetrics(arrival_time=arrival, first_scheduled_time=arrival, first_token_time=first,
                          finished_time=end if finished else None, num_output_tokens=len(itls) + 1,
                          num_prompt_tokens=10, itls=list(itls))


def test_meets_slo_checks_each_bound():
    m = _metrics(0.0, 0.2, [0.01] * 95 + [0.5] * 4)  # four 500 ms stalls among 99 gaps
    assert meets_slo(m, SLO(ttft_s=0.3))
    assert not meets_slo(m, SLO(ttft_s=0.1))
    assert meets_slo(m, SLO(tpot_s=0.05))  # the mean gap is about 30 ms
    assert not meets_slo(m, SLO(tpot_s=0.02))
    assert not meets_slo(m, SLO(tbt_p99_s=0.1))  # the stall is above the request's P99 TBT
    assert meets_slo(_metrics(0.0, 0.2, [0.01] * 200 + [0.5]), SLO(tbt_p99_s=0.1))  # one in 201: below P99
    assert meets_slo(_metrics(0.0, 0.2, []), SLO(ttft_s=0.3, tpot_s=1e-9, tbt_p99_s=1e-9))  # one token: TTFT only
    assert not meets_slo(_metrics(0.0, 0.2, [0.01], finished=False), SLO(ttft_s=1.0))


def test_goodput_on_hand_made_metrics():
    ms = {
        "fast": _metrics(0.0, 0.1, [0.02] * 4),  # finishes at 0.18
        "slow-start": _metrics(1.0, 2.0, [0.02] * 4),  # TTFT 2 s
        "stalls": _metrics(2.0, 0.1, [0.02, 0.9, 0.02]),  # finishes at 3.04
        "fast-late": _metrics(3.0, 0.2, [0.01] * 9 + [0.01]),  # finishes at 3.3: the last finish
    }
    slo = SLO(ttft_s=0.5, tbt_p99_s=0.1)
    assert slo_attainment(ms, slo) == 0.5
    assert goodput(ms, slo) == pytest.approx(2 / 3.3)  # 2 good requests over 0 -> 3.3 s
    assert goodput(list(ms.values()), slo, duration_s=10.0) == pytest.approx(0.2)
    assert goodput(ms, SLO(ttft_s=3.0)) == pytest.approx(4 / 3.3)
    assert goodput(ms, SLO(ttft_s=0.01)) == 0.0
    bench = ServingBenchmark.from_metrics(ms, slo)
    assert bench.completed == 4 and bench.request_goodput == pytest.approx(2 / 3.3)
    assert bench.latencies["TTFT"][0] == pytest.approx((0.1 + 2.0 + 0.1 + 0.2) / 4)
    assert bench.latencies["TTFT"][1] == pytest.approx(0.15)
    table = bench.as_table()
    for label in ("Successful requests:", "Request goodput (req/s):", "Mean TTFT (ms):", "P99 TPOT (ms):",
                  "Median ITL (ms):", "P99 E2EL (ms):", "Output token throughput (tok/s):"):
        assert label in table
    assert "600.00" in table  # mean TTFT in ms


def test_slo_validation():
    with pytest.raises(ValueError, match="ttft_s"):
        SLO(ttft_s=0)
    with pytest.raises(ValueError, match="tbt_p99_s"):
        SLO(tbt_p99_s=-1)
    assert str(SLO(ttft_s=0.5, tpot_s=0.05)) == "TTFT <= 500 ms, TPOT <= 50 ms"


# ---- capacity bisection --------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0.03, 0.7, 1.0, 7.3, 40.0])
def test_search_brackets_and_bisects(threshold):
    tried = []

    def passes(rate):
        tried.append(rate)
        return rate <= threshold

    found = search_highest_passing_rate(passes, start_rate=1.0, rel_tol=0.05, max_probes=30)
    assert threshold / 1.05 <= found <= threshold
    assert len(tried) < 30


def test_search_is_monotone_in_the_threshold():
    found = [search_highest_passing_rate(lambda r, t=t: r <= t, start_rate=2.0, rel_tol=0.1, max_probes=20)
             for t in (0.5, 1.0, 1.7, 3.0, 5.5, 9.0)]
    assert found == sorted(found) and found[0] > 0


def test_search_limits():
    assert search_highest_passing_rate(lambda r: False, max_probes=5) == 0.0
    assert search_highest_passing_rate(lambda r: True, start_rate=1.0, max_probes=4) == 8.0  # 1, 2, 4, 8 all pass
    with pytest.raises(ValueError, match="start_rate"):
        search_highest_passing_rate(lambda r: True, start_rate=0)


def test_mooncake_infinite_timestamp_is_rejected():
    from minengine.workloads.traces import parse_mooncake_jsonl

    for bad in ('{"timestamp": Infinity, "input_length": 10, "output_length": 2, "hash_ids": [1]}',
                '{"timestamp": 1e400, "input_length": 10, "output_length": 2, "hash_ids": [1]}'):
        with pytest.raises(ValueError, match="timestamp"):
            parse_mooncake_jsonl(bad)


def test_policy_benchmark_fills_the_readme_section(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "serving_policies.py"
    spec = importlib.util.spec_from_file_location("serving_policies", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\nbefore\n{mod.README_BEGIN}\nold\n{mod.README_END}\nafter\n")
    mod.update_readme(readme, "# Title\n\n## Azure\n\n| a |\n")
    text = readme.read_text()
    assert "old" not in text and "**Azure**" in text and "| a |" in text and "Title" not in text
    assert text.startswith("# x\nbefore\n") and text.endswith("after\n")
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="serving-policies"):
        mod.update_readme(readme, "# T\n")
