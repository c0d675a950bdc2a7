"""Bad input to the API, checkpoints, settings, the command line and the trace loaders: each case is an early
ValueError naming the field or the file (the CLI: an ``error:`` line naming the flag or the file and line, exit
code 2), and the engine goes on serving. The case lists live here."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minengine import EngineConfig, LLMEngine, SamplingParams
from minengine.__main__ import main
from minengine.models.loader import load_model, load_tokenizer
from minengine.workloads import gamma_arrivals, parse_azure_csv, parse_mooncake_jsonl, poisson_arrivals, with_arrivals
from minengine.workloads.traces import TraceRequest
from tests.conftest import drain

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


# the settings of this module's ``engine`` fixture (tests/conftest.py)
ENGINE_CONFIG = dict(max_model_len=256, num_kv_blocks=32)


# ---- the API ------------------------------------------------------------------------------------------------

def test_abort_request_takes_a_generator(engine):
    for rid in ("a", "b", "c"):
        engine.add_request(rid, "ROMEO:", GREEDY)
    engine.abort_request(rid for rid in ("a", "b"))  # read once: validating it must not consume it
    assert set(engine.scheduler.requests) == {"c"}
    assert engine.request_metrics["a"].finish_reason == "abort"
    drain(engine)


def test_reused_request_id_keeps_both_metrics(bundled_model):
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=256)
    engine.add_request("same", "ROMEO:", GREEDY)
    drain(engine)
    engine.add_request("same", "JULIET:", GREEDY)
    drain(engine)
    s = engine.summary()
    assert s.num_requests == 2 and s.output_tokens == 8
    engine.reset_stats()
    assert engine.summary().num_requests == 0


def test_arrival_time_in_the_future_is_rejected(engine):
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request("x", "ROMEO:", GREEDY, arrival_time=engine.clock() + 3600)
    engine.add_request("x", "ROMEO:", GREEDY, arrival_time=engine.clock() - 1.0)  # the past is fine
    out = drain(engine)["x"]
    assert out.metrics.ttft > 0


@pytest.mark.parametrize("prompt", ["ROMEO:\udcff", "\ud800", {"prompt": "a\udfffb"}])
def test_lone_surrogate_prompt_is_a_value_error(engine, prompt):
    with pytest.raises(ValueError, match="prompt is not valid Unicode"):
        engine.add_request("x", prompt, GREEDY)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("change", [
    dict(temperature=float("nan")), dict(top_p=7.0), dict(max_tokens=0), dict(stop=None), dict(top_k=0),
    dict(stop_token_ids=["x"]),
])
def test_sampling_params_changed_after_add_request(engine, change):
    """The engine keeps its own copy (as vLLM): changing the caller's params afterwards changes nothing."""
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    engine.add_request("p", "ROMEO:", params)
    for k, v in change.items():
        setattr(params, k, v)
    out = drain(engine)["p"]
    assert len(out.outputs[0].token_ids) == 3


# ---- checkpoints --------------------------------------------------------------------------------------------

def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


CHECKPOINT_CASES = {
    "truncated model.safetensors": ("model.safetensors", truncate),
    "garbage model.safetensors": ("model.safetensors", lambda p: p.write_bytes(b"\x00" * 100)),
    "empty model.safetensors": ("model.safetensors", lambda p: p.write_bytes(b"")),
    "garbled config.json": ("config.json", lambda p: p.write_text("{not json")),
    "empty config.json": ("config.json", lambda p: p.write_text("")),
    "config.json a list": ("config.json", lambda p: p.write_text("[1, 2]")),
    "config.json without model_type": ("config.json", lambda p: p.write_text('{"hidden_size": 64}')),
    "config.json with 0 heads": ("config.json", lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "num_attention_heads": 0}))),
    "config.json with a string size": ("config.json", lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "hidden_size": "big"}))),
    "config.json not matching the weights": ("config.json", lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "intermediate_size": 4 * json.loads(p.read_text())["intermediate_size"]}))),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_broken_checkpoint_is_a_value_error_naming_the_file(bundled_model, tmp_path, case):
    name, damage = CHECKPOINT_CASES[case]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(bundled_model, ckpt)
    damage(ckpt / name)
    with pytest.raises(ValueError, match=str(ckpt)):
        load_model(str(ckpt))
    code, err = run_cli("generate", "ROMEO:", "--model", str(ckpt), "--max-tokens", "2")
    assert code == 2 and str(ckpt) in err


def test_corrupt_tokenizer_is_a_value_error(bundled_model, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(bundled_model, ckpt)
    (ckpt / "tokenizer.json").write_text('{"garbled": ')
    with pytest.raises(ValueError, match="tokenizer"):
        load_tokenizer(ckpt)


# ---- settings -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(enable_chunked_prefill=False, long_prefill_token_threshold=8), "long_prefill_token_threshold"),
    (dict(num_kv_blocks=64, kv_cache_memory_bytes=10**6), "kv_cache_memory_bytes"),
])
def test_conflicting_settings(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_without_chunked_prefill_a_prompt_runs_in_one_step():
    from tests.fake_engine import FakeEngine

    eng = FakeEngine(budget=64, chunked=False, threshold=8, max_model_len=64)  # the scheduler ignores the cap
    eng.add("a", list(range(3, 33)), max_tokens=2)
    assert [s.num_new_tokens for s in eng.step().scheduled] == [30]


def test_free_memory_check_counts_reclaimable_memory(bundled_model, monkeypatch):
    """psutil's "available" (page cache counts) decides, not MemFree."""
    import psutil

    from minengine.worker.model_runner import kv_bytes_per_block

    class Memory:
        available = 64 * 2**20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=256, num_kv_blocks=16)
    per_block = kv_bytes_per_block(engine.model, 16, engine.runner.dtype)
    fits = Memory.available // per_block
    LLMEngine.from_config(model=bundled_model, max_model_len=256, num_kv_blocks=fits)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        LLMEngine.from_config(model=bundled_model, max_model_len=256, num_kv_blocks=fits + 1)


# ---- the command line ---------------------------------------------------------------------------------------

def run_cli(*args: str, capsys=None) -> tuple[int, str]:
    """``python -m minengine args`` in this process: (exit code, stderr)."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def write_prompts(tmp_path: Path, mt_bench: str) -> Path:
    (tmp_path / "prompts").mkdir(exist_ok=True)
    (tmp_path / "prompts" / "mt_bench_question.jsonl").write_text(mt_bench)
    return tmp_path


NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("content, where", [
    ('{"question": "hi"}\n', "line 1"), ('{"turns": ["ok"]}\n{"turns": []}\n', "line 2"), ("[1, 2]\n", "line 1"),
    ('{"turns": [5]}\n', "line 1"), ("{not json\n", "line 1"), (NESTED + "\n", "line 1"),
])
def test_malformed_real_prompts_file(tmp_path, content, where):
    data = write_prompts(tmp_path, content)
    code, err = run_cli("run", "--data-dir", str(data), "--num-prompts", "1", "--num-real-prompts", "4")
    assert code == 2 and "error:" in err and "mt_bench_question.jsonl" in err and where in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, flag", [
    (("run", "--num-prompts", str(10**12)), "--num-prompts"),
    (("bench-serve", "--trace", "poisson", "--length-scale", "-1"), "--length-scale"),
    (("bench-serve", "--trace", "poisson", "--length-scale", "nan"), "--length-scale"),
    (("bench-serve", "--trace", "poisson", "--speedup", "0"), "--speedup"),
    (("bench-serve", "--trace", "poisson", "--speedup", "inf"), "--speedup"),
    (("bench-serve", "--trace", "poisson", "--start-s", "-5"), "--start-s"),
    (("bench-serve", "--trace", "poisson", "--start-s", "nan"), "--start-s"),
    (("bench-serve", "--trace", "poisson", "--num-requests", str(10**12)), "--num-requests"),
    (("bench-serve", "--trace", "poisson", "--num-requests", "0"), "--num-requests"),
    (("bench-serve", "--trace", "poisson", "--burstiness", "1e-300"), "--burstiness"),
    (("bench-serve", "--trace", "poisson", "--request-rate", "0"), "--request-rate"),
    (("bench-serve", "--trace", "poisson", "--request-rate", "nan"), "--request-rate"),
    (("bench-serve", "--trace", "poisson", "--input-len", "0"), "--input-len"),
    (("bench-serve", "--trace", "poisson", "--range-ratio", "1.5"), "--range-ratio"),
    (("bench-serve", "--trace", "poisson", "--slo-ttft-ms", "-1"), "--slo-ttft-ms"),
    (("bench-serve", "--trace", "poisson", "--capacity-probes", "100000"), "--capacity-probes"),
    (("bench-serve", "--trace", "poisson", "--max-concurrency", "4"), "--max-concurrency"),  # was ignored
    (("serve", "--max-history-steps", "-1"), "--max-history-steps"),  # was accepted, then bound the port
    (("generate", "ROMEO:\udcff"), "prompt"),
    (("generate", "ROMEO:", "--model", "/tmp/\udcff"), "--model"),
    (("generate", "ROMEO:", "--no-chunked-prefill", "--long-prefill-token-threshold", "8",
      "--max-num-batched-tokens", "8192"), "long_prefill_token_threshold"),
    (("generate", "ROMEO:", "--num-kv-blocks", "64", "--kv-cache-memory-bytes", "1000000"),
     "kv_cache_memory_bytes"),
])
def test_bad_flags_are_error_lines(args, flag):
    code, err = run_cli(*args)
    assert code == 2 and "error:" in err and flag in err and "Traceback" not in err, (args, err)


def test_non_utf8_argv_is_an_error_line():
    """Bytes that are not UTF-8 on the real command line (they reach Python as lone surrogates)."""
    p = subprocess.run([sys.executable, "-m", "minengine", "generate", b"ROMEO:\xff\xfe"], capture_output=True,
                       timeout=600)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2 and "error:" in err and "prompt" in err and "Traceback" not in err, err


def test_trace_file_errors_name_the_file_and_line(tmp_path):
    csv_path = tmp_path / "trace.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n"
                        f'2023-11-16 18:15:47.0,"{"9" * 200_000}",5\n')
    code, err = run_cli("bench-serve", "--trace", "azure", "--trace-path", str(csv_path), "--num-requests", "2")
    assert code == 2 and str(csv_path) in err and "line 3" in err and "Traceback" not in err, err
    jsonl = tmp_path / "trace.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n' + NESTED + "\n")
    code, err = run_cli("bench-serve", "--trace", "mooncake", "--trace-path", str(jsonl), "--num-requests", "2")
    assert code == 2 and str(jsonl) in err and "line 2" in err and "Traceback" not in err, err


# ---- the loaders --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cv", [1e-300, 1e-200, 1e-160, 1e160, 1e300, math.inf, math.nan, 0, -1])
def test_gamma_arrivals_extreme_cv(cv):
    with pytest.raises(ValueError, match="cv"):
        gamma_arrivals(2.0, cv, 10)


@pytest.mark.parametrize("fn", [lambda: gamma_arrivals(5e-324, 1.0, 10), lambda: poisson_arrivals(5e-324, 10)])
def test_arrival_times_that_overflow(fn):
    with pytest.raises(ValueError, match="overflow"):
        fn()


@pytest.mark.parametrize("times", [[0.0, math.nan], [0.0, math.inf], [math.nan, 1.0], [-1.0, 0.0], [0.0, "1"],
                                   [1.0, 0.5]])
def test_with_arrivals_rejects_non_finite_times(times):
    trace = [TraceRequest(0.0, 4, 2, None, "a"), TraceRequest(1.0, 4, 2, None, "b")]
    with pytest.raises(ValueError, match="arrival_times"):
        with_arrivals(trace, times)


@pytest.mark.parametrize("text, line", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n" + f'2023-11-16 18:15:46.68,"{"1" * 200_000}",5\n', "line 2"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10\x00,5\n", "line 2"),
    (f'"{"T" * 200_000}",ContextTokens,GeneratedTokens\n', "line 1"),
])
def test_azure_csv_errors_are_value_errors(text, line):
    with pytest.raises(ValueError, match=line):
        parse_azure_csv(text)


def test_mooncake_deeply_nested_line():
    with pytest.raises(ValueError, match="line 1"):
        parse_mooncake_jsonl(NESTED)
