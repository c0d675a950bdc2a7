"""The performance benchmarks run on tiny settings and their outputs equal the reference (timings are not
checked: they belong to the benchmarks, not to the test suite)."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # the GPU script's dry run uses the Triton interpreter

import pytest

from benchmarks import host_overhead, predictive, sliding_window, spec_decode, throughput


def test_throughput_benchmark_tiny(tmp_path):
    out = tmp_path / "t.json"
    result = throughput.main(["--num-requests", "3", "--prompt-len", "8,24", "--output-len", "3,5", "--threads", "1",
                              "--repeats", "1", "--skip-continuous", "--json", str(out)])
    (row,) = result["rows"]
    assert row["outputs_equal"] == row["num_requests"] == 3
    assert row["roof_gflops"] > 0 and row["copy_gbytes_per_s"] > 0 and 0 < row["roofline_fraction"]
    # The steps' FLOPs equal the workload's, counted per request without the schedule: each request computes
    # its prompt and all but its last output token once (no preemption here), and samples every output.
    from minengine.config import BUNDLED_MODEL

    shape = throughput.model_shape(BUNDLED_MODEL)
    work = throughput.make_workload(shape.vocab_size, 3, 0, (8, 24), (3, 5))
    tokens = sum(len(p) + n - 1 for p, n in work)
    pairs = sum((len(p) + n - 1) * (len(p) + n) // 2 for p, n in work)
    gemm_weights = shape.num_layers * sum(k * n for k, n in shape.linear_shapes())  # the matmuls (no norm weights)
    flops = (2 * gemm_weights * tokens + 4 * shape.num_layers * shape.q_size * pairs
             + 2 * shape.lm_head_params * sum(n for _, n in work))
    assert abs(row["gflop"] * 1e9 - flops) < 1e-6 * flops
    assert json.loads(out.read_text())["rows"][0]["outputs_equal"] == 3


def test_host_overhead_benchmark_tiny(tmp_path):
    from minengine.config import BUNDLED_MODEL

    result = host_overhead.main(["--num-requests", "1,3", "--contexts", "20", "--steps", "2", "--engine-context", "8",
                                 "--tokenizer", str(Path(BUNDLED_MODEL) / "tokenizer.json"), "--out", str(tmp_path)])
    rows, engine_rows = result["scheduler_and_inputs"], result["engine_step"]
    assert [(r["num_requests"], r["context"]) for r in rows] == [(1, 20), (3, 20)]
    assert all(r["schedule_update_ms"] > 0 and r["prepare_torch_ms"] > 0 for r in rows)
    assert [(r["num_requests"], r["mix"]) for r in engine_rows] == [(1, "greedy"), (3, "greedy"), (1, "sampled"),
                                                                     (3, "sampled")]
    for r in engine_rows:  # every part measured, and the output path is what is left of the step
        assert r["sampler_ms"] > 0 and r["prepare_ms"] > 0 and r["logits_pass_ms"] > 0
        assert 0 < r["outputs_ms"] < r["step_ms"]
    assert (tmp_path / "host_overhead.md").read_text().count("\n") == 4 + 1 + 2 + 4 + 1
    assert json.loads((tmp_path / "host_overhead.json").read_text())["engine_step"][0]["vocab"] == r["vocab"]
    assert (tmp_path / "host_overhead.html").exists()


def test_sliding_window_benchmark_tiny(tmp_path):
    """Blocks held over a generation: the windowed request reaches its decode bound and stays there, the full one
    holds a block per block_size tokens (``run`` asserts both)."""
    result = sliding_window.main(["--window", "6", "--block-size", "4", "--prompt-len", "10", "--output-len", "30",
                                  "--chunk", "8", "--out", str(tmp_path), "--no-png"])
    assert result["max_blocks_windowed_decode"] == result["decode_bound"] == 3 < result["max_blocks_full"] == 10
    assert result["tokens_differ"]  # the window changes what the model says
    assert "| full | 10 | 10 |" in (tmp_path / "sliding_window.md").read_text()
    # the mixed model: its full-attention group holds a block per block_size tokens, its windowed group the bound
    assert result["max_blocks_mixed_windowed_group_decode"] == 3 < result["max_blocks_mixed_full_group"] == 10
    assert "| windowed layers | " in (tmp_path / "sliding_window.md").read_text()


def test_gpu_script_dry_run_on_cpu(tmp_path):
    """benchmarks/gpu/run.py --device cpu --tiny: every section's code path, on tiny random models."""
    pytest.importorskip("triton")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "run.py"
    spec = importlib.util.spec_from_file_location("gpu_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gpu.json"
    result = mod.main(["--device", "cpu", "--tiny", "--out", str(out)])
    assert json.loads(out.read_text())["info"]["tiny"]
    for c in result["correctness"]:
        assert c["float32"]["verdicts"] == ["exact"] * len(c["float32"]["verdicts"])
        assert c["float32"]["attention_backend"] == "triton" and c["float32"]["graph_replays"] > 0
    for t in result["triton"]:
        assert t["max_abs_err"] < (1e-5 if t["dtype"] == "float32" else 3e-2)
    assert {d["mode"] for d in result["decode"]} == {"graphs", "eager"}
    assert result["throughput"]["hf_static_2_agreement"] > 0


def test_spec_decode_benchmark_tiny(tmp_path):
    rows = spec_decode.main(["--num-requests", "2", "--prompt-len", "32", "--max-tokens", "8", "--ks", "0", "2",
                             "--repeats", "1", "--write", "--out", str(tmp_path / "s.md")])
    assert [(r["workload"], r["k"]) for r in rows] == [(w, k) for w in ("copy", "random, greedy", "random, sampled")
                                                       for k in (0, 2)]
    assert all(r["same"] for r in rows)  # speculation never changes the tokens
    assert all(r["tokens_per_decode"] >= 1 and r["modelled_tpot_ms"] > 0 for r in rows)
    assert "| copy | off |" in (tmp_path / "s.md").read_text()


def test_predictive_benchmark_tiny(tmp_path):
    from minengine.workloads import azure_conv_path, find_data_dir

    if azure_conv_path(find_data_dir(None)) is None:
        pytest.skip("shared/data (Azure trace) absent")
    result = predictive.main(["--requests", "40", "--speedup", "4", "--num-kv-blocks", "512", "--sigmas", "0.5",
                              "--write", "--out", str(tmp_path)])
    rows = {r["label"]: r for r in result["policies"]}
    assert all(r["finished"] == r["requests"] == 40 for r in rows.values())
    assert rows["FCFS + reserve KV, oracle"]["preemptions"] == 0  # exact predictions: nobody outgrows its share
    assert result["errors"][0]["mae"] < result["errors"][1]["mae"]  # learned beats the constant
    saved = json.loads((tmp_path / "predictive.json").read_text())
    assert len(saved["sample"]["true"]) == len(saved["sample"]["learned"]) > 0


def test_structured_output_benchmark_tiny(tmp_path):
    from benchmarks import structured_output

    result = structured_output.main(["--base", "HEAD", "--repeats", "1", "--requests", "4", "--new-tokens", "8",
                                     "--out", str(tmp_path)])
    assert all(len(v) == 1 and v[0] > 0 for v in result["tokens_per_cpu_s"].values())
    assert result["head_over_base"] > 0 and result["mask_fill_us_median"] > 0
    assert json.loads((tmp_path / "structured_output.json").read_text())["base"] == "HEAD"


def test_async_scheduling_benchmark_tiny(tmp_path):
    """One in-process and one async worker-process setting on 2 requests: the JSON is strict (no NaN: the in-process
    row has no worker spans, so its overlap is null) and the worker row's overlap is a share."""
    from benchmarks import async_scheduling

    async_scheduling.main(["--num-requests", "2", "--prompt-len", "8", "--steps", "3", "--warmup", "1",
                           "--rounds", "1", "--settings", "0,2", "--out", str(tmp_path)])
    text = (tmp_path / "async_scheduling.json").read_text()
    rows = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))["rows"]
    assert [r["setting"] for r in rows] == ["in-process (uni)", "TP 1, 1 worker, async"]
    assert rows[0]["overlap"] is None and 0.0 <= rows[1]["overlap"] <= 1.0
    assert all(r["wall_ms"] > 0 and r["host_ms"] > 0 for r in rows)


def test_the_docs_state_the_mixed_model_numbers_of_the_saved_sliding_window_result():
    """The sentences on the two-KV-cache-group model in docs/ quote ``benchmarks/results/sliding_window.json``."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = json.loads((root / "benchmarks" / "results" / "sliding_window.json").read_text())
    full, any_step, decode = (r["max_blocks_mixed_full_group"], r["max_blocks_mixed_windowed_group"],
                              r["max_blocks_mixed_windowed_group_decode"])
    assert decode == r["decode_bound"]
    real_models = " ".join((root / "docs" / "features" / "real_models.md").read_text().split())
    assert (f"its full-attention group ends at {full} blocks, its windowed group holds at most {decode} in every "
            f"decode step ({any_step} while the prompt's chunks are computed)") in real_models
    benchmarks = " ".join((root / "docs" / "benchmarks.md").read_text().split())
    assert (f"full-attention group ends at {full} blocks and the windowed group holds at most {decode} in every "
            f"decode step ({any_step} during the prompt's chunks)") in benchmarks


def test_real_shape_benchmark_tiny(tmp_path, monkeypatch):
    """benchmarks/real_shape.py on a hidden-64 Llama: every field of the JSON, greedy outputs equal to
    transformers' in float32 (single stream and batched), int8 reads fewer weight bytes and is compared with
    float32, and the checkpoint keeps the hub-format config.json it was built from."""
    from benchmarks import real_shape

    monkeypatch.setenv("MINENGINE_REAL_SHAPE_CACHE", str(tmp_path / "cache"))
    result = real_shape.main(["--shapes", "tiny", "--dtypes", "float32,int8", "--threads", "1", "--repeats", "1",
                              "--prompt-len", "24", "--decode-tokens", "3", "--batch-requests", "3",
                              "--batch-prompt-len", "8", "--batch-output-len", "4", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "real_shape.json").read_text())
    assert saved["shapes"][0]["shape"] == "tiny" and saved["settings"]["repeats"] == 1
    (shape,) = result["shapes"]
    ckpt = shape["checkpoint"]
    assert json.loads((Path(ckpt) / "config.json").read_text()) == real_shape.HUB_CONFIGS["tiny"]
    assert set(shape["roofs"]) == {1} and all(v > 0 for v in shape["roofs"][1].values())
    f32, int8 = shape["rows"]
    assert (f32["dtype"], int8["dtype"]) == ("float32", "int8")
    assert f32["outputs_equal"] == {"single": "1/1", "batched": "3/3"}
    for row in (f32, int8):
        me = row["minengine"]
        assert all(me["single"][k] > 0 for k in ("prefill_tok_s", "prefill_cpu_tok_s", "decode_tok_s", "decode_ms",
                                                 "decode_cpu_ms", "weight_bytes_per_step"))
        assert me["batched"]["tok_s"] > 0 and me["batched"]["cpu_s"] > 0
        assert 0 < me["decode_bandwidth_fraction"] and 0 < me["batched_roof_fraction_cpu"]
        assert row["ratios"]["decode"] > 0 and row["ratios"]["batched_cpu"] > 0 and row["load_before"]
    assert f32["ratios"]["peer"] == "transformers" and int8["ratios"]["peer"] == "transformers float32"
    assert int8["minengine"]["single"]["weight_bytes_per_step"] < f32["minengine"]["single"]["weight_bytes_per_step"]
    assert int8["int8_over_float32"]["decode"] > 0 and "llama_bench" not in f32
    md = (tmp_path / "real_shape.md").read_text()
    assert "## tiny" in md and "| int8" in md and "llama.cpp" not in md


def test_real_shape_configs_have_the_published_sizes(tmp_path):
    """The three hub configs written from knowledge give the models' published parameter counts (SmolLM-135M:
    134.5 M; Qwen2.5-0.5B: 0.49 B; Llama-3.2-1B: 1.24 B, tied embeddings counted once), and minengine reads
    Llama-3.2's llama3 RoPE scaling from the hub-format file as transformers does."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from benchmarks import real_shape
    from minengine.layers.rotary import rope_inv_freq

    published = {"smollm-135m": 134.5e6, "qwen2.5-0.5b": 494.0e6, "llama-3.2-1b": 1235.8e6}
    for name, count in published.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(real_shape.HUB_CONFIGS[name]))
        cfg = AutoConfig.from_pretrained(tmp_path / name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        assert abs(sum(p.numel() for p in model.parameters()) - count) < 1e-3 * count, name
    cfg = AutoConfig.from_pretrained(tmp_path / "llama-3.2-1b")
    inv_freq, _ = rope_inv_freq(cfg)
    plain = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
    assert inv_freq[0] == plain[0] and inv_freq[-1] < plain[-1] / 31  # low frequencies divided by the factor 32


def test_the_docs_quote_the_saved_real_shape_result():
    """Every table row of the real-shape section in docs/benchmarks.md is a row of
    ``benchmarks/results/real_shape.md``, and the section's sentence on the ratios quotes the saved JSON."""
    root = Path(__file__).resolve().parents[2]
    results = (root / "benchmarks" / "results" / "real_shape.md").read_text().splitlines()
    docs = (root / "docs" / "benchmarks.md").read_text()
    section = docs.split("## Real-shaped models", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(rows) >= 4  # the roofs, and at least one row of each table
    assert all(row in results for row in rows), [row for row in rows if row not in results]
    saved = json.loads((root / "benchmarks" / "results" / "real_shape.json").read_text())
    f32 = next(r for r in saved["shapes"][0]["rows"] if r["dtype"] == "float32" and r["threads"] == 1)
    text = " ".join(section.split())
    assert (f"{f32['ratios']['decode_cpu']:.2f}x transformers' decode in CPU time "
            f"({f32['minengine']['single']['decode_cpu_ms']:.1f} vs "
            f"{1e3 / f32['transformers']['single']['decode_cpu_tok_s']:.1f} ms of CPU per step)") in text
    assert f"batched, {f32['ratios']['batched_cpu']:.2f}x in CPU time" in text
    assert (f"{saved['elapsed_s']:.0f} s of wall time and {saved['cpu_s']:.0f} s of its own CPU time" in text
            and (saved["complete"] or "stopped" in text))  # a partial run says so
