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

from minengine.config import EngineConfig
from minengine.workloads import (
    SLO,
    CapacityProbe,
    CapacityResult,
    ServingBenchmark,
    find_capacity,
    find_data_dir,
    load_azure_trace,
    load_mooncake_trace,
    search_rate_bracket,
)
from minengine.workloads.traces import azure_conv_path, mooncake_path

ROOT = Path(__file__).resolve().parents[1]


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
    assert CapacityResult(8.0, SLO(ttft_s=1), [probe], failing_rate=9.0).describe() == "8 req/s"
    unbounded = CapacityResult(2560.0, SLO(ttft_s=1), [probe])
    assert unbounded.describe() == "≥ 2,560 req/s (no failing rate found)" and not unbounded.bounded
    none = CapacityResult(0.0, SLO(ttft_s=1), [CapacityProbe(0.5, 0.0, 9.0, 0.0, False)], failing_rate=0.5)
    assert none.describe() == "< 0.5 req/s (no passing rate found)"


def test_find_capacity_on_the_modelled_clock_is_deterministic_and_bracketed(random_llama):
    cfg = EngineConfig(model=random_llama, block_size=16, num_kv_blocks=96, max_num_batched_tokens=64,
                       max_num_seqs=4, max_model_len=512)
    from minengine.timing import ClockSpec

    kwargs = dict(num_requests=12, start_rate=1.0, rel_tol=0.2, max_probes=12, seed=0,
                  clock=ClockSpec("modelled", hardware="a100", model="llama-3-8b"))
    slo = SLO(ttft_s=0.25, tbt_p99_s=0.1)
    a = find_capacity(slo, cfg, **kwargs)
    b = find_capacity(slo, cfg, **kwargs)
    assert a.probes == b.probes and a.capacity == b.capacity  # the same numbers every run
    assert a.bounded and a.capacity < a.failing_rate <= a.capacity * 1.2
    assert a.clock_label == "modelled: A100 80GB, Llama-3-8B shapes"
    rates = [p.rate for p in a.probes]
    assert rates[:5] == [1.0, 2.0, 4.0, 8.0, 16.0] and not a.probes[4].passed  # grew until a probe failed
    assert all(lo < r < 16.0 for r, lo in zip(rates[5:], [8.0] * 10))  # then bisected inside the bracket
    # a generous SLO on a fast GPU within few probes: no failing rate, and the result says so
    easy = find_capacity(SLO(ttft_s=10.0), cfg, **{**kwargs, "max_probes": 3,
                                                   "clock": ClockSpec("modelled", hardware="h200")})
    assert easy.failing_rate == math.inf and easy.describe() == "≥ 4 req/s (no failing rate found)"


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
