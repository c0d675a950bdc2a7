"""The capacity search (grows until a probe fails, then bisects; says so when nothing failed), the serving table's
SLO section, the CLI's engine flags generated from ``EngineConfig`` (defaults cannot drift, nothing printed twice),
``bench-serve --clock``, the policy benchmark's ``--write``, and the trace loaders' missing-file message."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine.config import EngineConfig
from minengine.workloads import (
    SLO,
    CapacityProbe,
    CapacityResult,
    ServingBenchmark,
    completed_fraction,
    find_capacity,
    find_data_dir,
    load_azure_trace,
    load_mooncake_trace,
    search_rate_bracket,
)
from minengine.workloads.traces import azure_conv_path, mooncake_path

ROOT = Path(__file__).resolve().parents[2]


# ---- the capacity search ---------------------------------------------------------------------------------------
def test_search_grows_until_a_probe_fails_then_bisects():
    tried = []

    def passes(rate):
        tried.append(rate)
        return rate <= 37.0

    lo, hi = search_rate_bracket(passes, start_rate=1.0, rel_tol=0.05, max_probes=30)
    assert tried[:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling while passing, up to the first failure
    assert 37.0 / 1.05 <= lo <= 37.0 < hi <= lo * 1.05
    assert all(t > 37.0 for t in list(tried) if t > lo)  # every rate above the capacity was a failure


def test_search_reports_when_no_rate_failed():
    lo, hi = search_rate_bracket(lambda r: True, start_rate=1.0, max_probes=5)
    assert (lo, hi) == (16.0, math.inf)
    lo, hi = search_rate_bracket(lambda r: True, start_rate=1.0, max_probes=50, max_rate=10.0)
    assert (lo, hi) == (10.0, math.inf)  # stopped at the limit, not at the probe budget
    lo, hi = search_rate_bracket(lambda r: False, start_rate=1.0, max_probes=3)
    assert lo == 0.0 and hi == 0.25
    with pytest.raises(ValueError, match="max_rate"):
        search_rate_bracket(lambda r: True, start_rate=5.0, max_rate=1.0)


def test_capacity_result_says_what_it_knows():
    probe = CapacityProbe(4.0, 1.0, 0.01, 4.0, True)
    slo = SLO(ttft_s=1)
    by_slo = CapacityResult(8.0, slo, [probe], failing_rate=9.0, max_throughput=20.0, peak_running=4,
                            num_requests=32)
    assert by_slo.bound == "slo" and by_slo.steady
    assert by_slo.describe() == "8 req/s (the SLO bounds it: 9 req/s failed)"
    by_throughput = CapacityResult(20.0, slo, [probe], max_throughput=20.0, peak_running=4, num_requests=32)
    assert by_throughput.bound == "throughput" and not by_throughput.bounded
    assert by_throughput.describe().startswith("20 req/s (= the maximum throughput: every rate up to it met the SLO")
    by_probes = CapacityResult(2560.0, slo, [probe], max_throughput=6000.0, peak_running=4, num_requests=32)
    assert by_probes.bound == "probes"
    assert by_probes.describe() == "≥ 2,560 req/s (no failing rate within 1 probes; maximum throughput 6,000 req/s)"
    none = CapacityResult(0.0, slo, [CapacityProbe(0.5, 0.0, 9.0, 0.0, False)], failing_rate=0.5)
    assert none.bound == "none" and none.describe() == "< 0.5 req/s (no passing rate found)"
    # the old flaw: a probe of 64 requests on 64 slots measures a burst absorbed; the text says so
    burst = CapacityResult(8.0, slo, [probe], failing_rate=9.0, max_throughput=20.0, peak_running=64,
                           num_requests=64)
    assert not burst.steady and "64 requests for 64 running at once" in burst.describe()
    assert "a transient, not a steady state" in burst.describe()


def _capacity_config(model, **fields):
    return EngineConfig(**{**dict(model=model, block_size=16, num_kv_blocks=96, max_num_batched_tokens=64,
                                  max_num_seqs=4, max_model_len=512), **fields})


def test_find_capacity_on_the_modelled_clock_is_deterministic_and_bracketed(random_llama):
    from minengine.timing import ClockSpec
    from minengine.workloads import TraceRequest

    cfg = _capacity_config(random_llama, max_num_seqs=2)
    kwargs = dict(rel_tol=0.2, max_probes=8, seed=0, clock=ClockSpec("modelled", hardware="a100", model="llama-3-8b"),
                  lengths=[TraceRequest(0.0, 48, 16, None, "r")])
    slo = SLO(ttft_s=0.05, tbt_p99_s=0.1)
    a = find_capacity(slo, cfg, **kwargs)
    b = find_capacity(slo, cfg, **kwargs)
    assert a.probes == b.probes and a.capacity == b.capacity and a.max_throughput == b.max_throughput  # every run
    assert a.clock_label == "modelled: A100 80GB, Llama-3-8B shapes"
    # a steady state: 8 requests per running slot (2 slots, both filled by the saturating run), a quarter not measured
    assert a.num_requests == 16 and a.peak_running == 2 and a.steady and a.warmup_requests == 4
    assert a.bounded and a.bound == "slo" and a.capacity < a.failing_rate <= a.capacity * 1.2
    assert a.probes[0].rate == pytest.approx(a.max_throughput / 2)  # the search starts at half the maximum
    assert all(p.rate <= a.max_throughput for p in a.probes)
    # a generous SLO every probe meets: the engine's pace bounds the capacity, below the all-at-once throughput,
    # because a probe at that throughput falls behind its Poisson arrivals although its latencies are within the SLO
    easy = find_capacity(SLO(ttft_s=10.0), cfg, **{**kwargs, "clock": ClockSpec("modelled", hardware="h200")})
    behind = next(p for p in easy.probes if p.rate == easy.failing_rate)
    assert easy.bound == "throughput" and easy.capacity < easy.failing_rate <= easy.max_throughput
    assert behind.attainment == 1.0 and not behind.sustained and behind.completed_fraction < 0.95
    assert all(p.sustained and p.completed_fraction >= 0.95 for p in easy.probes if p.passed)
    assert "the engine's throughput bounds it, not the SLO: at" in easy.describe()
    assert "completions fell behind arrivals" in easy.describe()
    # without the pace condition the search would accept the all-at-once throughput: the condition is what moved it
    lax = find_capacity(SLO(ttft_s=10.0), cfg, **{**kwargs, "clock": ClockSpec("modelled", hardware="h200"),
                                                  "min_completed_fraction": 1e-9})
    assert lax.bound == "throughput" and lax.capacity == lax.max_throughput > easy.capacity
    # a probe budget too small to reach either: a lower bound, said so
    short = find_capacity(SLO(ttft_s=10.0), cfg, **{**kwargs, "start_rate": 1.0, "max_probes": 3,
                                                     "clock": ClockSpec("modelled", hardware="h200")})
    assert [p.rate for p in short.probes] == [1.0, 2.0, 4.0] and short.bound == "probes"
    with pytest.raises(ValueError, match="min_completed_fraction"):
        find_capacity(slo, cfg, **{**kwargs, "min_completed_fraction": 0.0})
    assert short.describe().startswith("≥ 4 req/s (no failing rate within 3 probes; maximum throughput ")


def test_completed_fraction_counts_completions_against_arrivals_over_the_arrival_window():
    from minengine.outputs import RequestMetrics

    def run(finishes):  # request i arrives at time i and finishes at finishes[i]
        return [RequestMetrics(arrival_time=float(i), finished_time=f) for i, f in enumerate(finishes)]

    keeps_up = run([0.5 + i for i in range(8)])           # each done before the next arrives
    assert completed_fraction(keeps_up) == 1.0
    falls_behind = run([2.0 * i + 1 for i in range(8)])  # one completion every 2 s, one arrival every second
    # window (0, 7]: arrivals 1..7 (7), completions at 1, 3, 5, 7 (4)
    assert completed_fraction(falls_behind) == pytest.approx(4 / 7)
    # the warm-up's requests are left out of the window's start, not of the completions inside it
    assert completed_fraction(falls_behind, warmup=2) == pytest.approx(3 / 5)  # window (2, 7]: completions 3, 5, 7
    assert completed_fraction(run([None, None])) == 0.0
    with pytest.raises(ValueError, match="warmup"):
        completed_fraction(keeps_up, warmup=8)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seqs=st.integers(1, 4), budget=st.sampled_from([32, 64, 128]), prompt=st.integers(4, 48),
       output=st.integers(2, 12), ttft_ms=st.floats(2, 5000), tbt_ms=st.one_of(st.none(), st.floats(2, 500)),
       start_rate=st.floats(0.5, 1e5), hardware=st.sampled_from(["h100", "l4"]), seed=st.integers(0, 3))
def test_capacity_never_exceeds_the_maximum_throughput(random_llama, seqs, budget, prompt, output, ttft_ms, tbt_ms,
                                                       start_rate, hardware, seed):
    """Whatever the engine, the SLO and the starting rate: the capacity is at most the requests per second the
    engine completes when they all arrive at once (measured here, independently of the search)."""
    from minengine.timing import ClockSpec
    from minengine.workloads import TraceRequest, replay_trace, with_arrivals

    cfg = _capacity_config(random_llama, max_num_seqs=seqs, max_num_batched_tokens=budget)
    clock = ClockSpec("modelled", hardware=hardware, model="llama-3-8b")
    lengths = [TraceRequest(0.0, prompt, output, None, "r")]
    n = 12
    cap = find_capacity(SLO(ttft_s=ttft_ms / 1000, tbt_p99_s=None if tbt_ms is None else tbt_ms / 1000), cfg,
                        lengths=lengths, num_requests=n, start_rate=start_rate, max_probes=4, seed=seed, clock=clock)
    base = [TraceRequest(0.0, prompt, output, None, f"r#{i}") for i in range(n)]
    burst = replay_trace(with_arrivals(base, [0.0] * n), cfg, clock=clock, seed=seed)
    done = [m.finished_time for m in burst.request_metrics.values()]
    max_throughput = n / (max(done) - min(m.arrival_time for m in burst.request_metrics.values()))
    assert cap.capacity <= max_throughput * (1 + 1e-9), (cap.capacity, max_throughput, cap.probes)
    assert cap.max_throughput == pytest.approx(max_throughput)


# ---- the serving table ------------------------------------------------------------------------------------------
def test_serving_table_has_a_filled_slo_section():
    from minengine.outputs import RequestMetrics

    def req(ttft, itl):
        m = RequestMetrics(arrival_time=0.0, num_prompt_tokens=4)
        m.first_scheduled_time, m.first_token_time = 0.0, ttft
        m.itls = [itl, itl]
        m.finished_time, m.num_output_tokens = ttft + 2 * itl, 3
        return m

    ms = [req(0.1, 0.01), req(0.9, 0.01), req(0.1, 0.5)]
    table = ServingBenchmark.from_metrics(ms, SLO(ttft_s=0.5, tbt_p99_s=0.1)).as_table()
    section = table.split("SLO attainment", 1)[1]
    assert "Within TTFT <= 500 ms:                  2/3 (66.7%)" in section
    assert "Within P99 TBT <= 100 ms:               2/3 (66.7%)" in section
    assert "Within all SLOs (goodput):              1/3 (33.3%)" in section
    assert "SLO" not in ServingBenchmark.from_metrics(ms, None).as_table()


# ---- the CLI -------------------------------------------------------------------------------------------------------
def _parser(command: str) -> argparse.ArgumentParser:
    from minengine import __main__ as cli

    p = argparse.ArgumentParser()
    cli._engine_args(p)
    return p


def test_engine_flags_are_generated_from_engine_config():
    from minengine import __main__ as cli

    p = _parser("run")
    a = p.parse_args([])
    config = cli._config(a)
    defaults = EngineConfig()
    for f in dataclasses.fields(EngineConfig):
        if f.name not in ("extra", "output_length_predictor", "logits_processors"):  # objects, not CLI settings
            assert getattr(config, f.name) == getattr(defaults, f.name), f.name  # the defaults cannot drift
    a = p.parse_args(["--no-chunked-prefill", "--max-num-batched-tokens", "4096", "--no-enable-prefix-caching",
                      "--num-cpu-threads", "none", "--scheduling-policy", "priority", "--prefill-decode-ratio", "2.5"])
    c = cli._config(a)
    assert (c.enable_chunked_prefill, c.max_num_batched_tokens, c.enable_prefix_caching, c.num_cpu_threads,
            c.scheduling_policy, c.prefill_decode_ratio) == (False, 4096, False, None, "priority", 2.5)
    with pytest.raises(SystemExit):
        p.parse_args(["--dtype", "float64"])


@pytest.mark.parametrize("command", ["run", "generate", "bench-serve"])
def test_help_shows_every_default_once(command):
    text = subprocess.run([sys.executable, "-m", "minengine", command, "--help"], capture_output=True, text=True,
                          timeout=120).stdout
    entries = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    for entry in entries:
        if not entry.strip() or entry.split()[0] in ("-h,", "prompt"):
            continue
        assert entry.count("(default") == 1, entry  # every option shows its default, exactly once
    for f in dataclasses.fields(EngineConfig):
        if f.name not in ("extra", "output_length_predictor", "logits_processors"):  # objects, not CLI settings
            assert "--" + f.name.replace("_", "-") in text, f.name
    assert "(default: 2048)" in text and "(default: 64)" in text  # EngineConfig's budget and slots


def test_bench_serve_on_the_modelled_clock(random_llama, capsys):
    from minengine.__main__ import main

    argv = ["bench-serve", "--model", random_llama, "--trace", "poisson", "--num-requests", "6", "--request-rate",
            "20", "--input-len", "24", "--output-len", "4", "--num-kv-blocks", "64", "--max-model-len", "256",
            "--slo-ttft-ms", "100", "--clock", "modelled", "--hardware", "a100", "--model-shape", "qwen2.5-7b"]
    main(argv)
    first = capsys.readouterr().out
    assert "clock: modelled: A100 80GB, Qwen2.5-7B shapes" in first and "Within TTFT <= 100 ms:" in first
    main(argv)
    second = capsys.readouterr().out

    def table(text):
        return text.split("Serving Benchmark Result")[1].split("steps ")[0]

    assert table(first) == table(second)  # deterministic, unlike a measured clock
    with pytest.raises(SystemExit):
        main(argv + ["--clock", "sundial"])


# ---- the policy benchmark writes tracked files only on request ----------------------------------------------------
@pytest.mark.skipif(azure_conv_path(find_data_dir()) is None or mooncake_path(find_data_dir()) is None,
                    reason="shared/data traces absent")
def test_policy_benchmark_writes_only_with_write(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("serving_policies", ROOT / "benchmarks" / "serving_policies.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out, readme = tmp_path / "out.md", tmp_path / "README.md"
    readme.write_text(f"x\n{mod.README_BEGIN}\nold\n{mod.README_END}\n")
    args = ["--policies", "decode-first", "--azure-requests", "3", "--mooncake-requests", "3", "--clock", "modelled",
            "--out", str(out), "--readme", str(readme)]
    mod.main(args)
    assert not out.exists() and "old" in readme.read_text() and "--write" in capsys.readouterr().out
    mod.main(args + ["--write"])
    assert out.exists() and "old" not in readme.read_text() and "modelled: H100 SXM" in out.read_text()


def test_missing_trace_file_says_where_to_put_it():
    for loader, name in ((load_azure_trace, "AzureLLMInferenceTrace_conv.csv"),
                         (load_mooncake_trace, "synthetic_trace.jsonl")):
        with pytest.raises(FileNotFoundError, match=name) as err:
            loader(None)  # what azure_conv_path(find_data_dir()) gives without ../shared/data
        assert "shared/data" in str(err.value) and "MINENGINE_DATA" in str(err.value)
