"""The performance benchmarks run on tiny settings and their outputs equal the reference (timings are not
checked: they belong to the benchmarks, not to the test suite)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # the GPU script's dry run uses the Triton interpreter

import pytest

from benchmarks import host_overhead, throughput
from benchmarks.throughput import ModelShape, step_work


def test_step_work_counts_match_a_brute_force_sum():
    shape = ModelShape(layers=2, hidden=8, intermediate=16, heads=4, kv_heads=2, head_dim=2, vocab=32)
    chunks = [(0, 5, True), (7, 1, True), (3, 4, False)]
    flops, nbytes = step_work(shape, chunks)
    per_token = 2 * shape.layers * (8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16)
    attention = sum(4 * 4 * 2 * shape.layers * (p + 1) for start, n, _ in chunks for p in range(start, start + n))
    assert flops == 10 * per_token + 2 * 2 * 8 * 32 + attention
    kv_token = 2 * shape.layers * 2 * 2 * 4
    weights = (shape.layers * shape.layer_params + 8 * 32) * 4
    assert nbytes == weights + (5 + 8 + 7) * kv_token + 10 * kv_token + 10 * 8 * 4


def test_throughput_benchmark_tiny(tmp_path):
    out = tmp_path / "t.json"
    result = throughput.main(["--num-requests", "3", "--prompt-len", "8,24", "--output-len", "3,5", "--threads", "1",
                              "--repeats", "1", "--skip-continuous", "--json", str(out)])
    (row,) = result["rows"]
    assert row["outputs_equal"] == row["num_requests"] == 3
    assert row["gflop"] > 0 and row["roof_gflops"] > 0 and 0 < row["roofline_fraction"]
    assert json.loads(out.read_text())["rows"][0]["outputs_equal"] == 3


def test_host_overhead_benchmark_tiny(tmp_path):
    rows = host_overhead.main(["--num-requests", "1,3", "--contexts", "20", "--steps", "2", "--out", str(tmp_path)])
    assert [(r["num_requests"], r["context"]) for r in rows] == [(1, 20), (3, 20)]
    assert all(r["schedule_update_ms"] > 0 and r["prepare_torch_ms"] > 0 for r in rows)
    assert (tmp_path / "host_overhead.md").read_text().count("\n") == 4
    assert (tmp_path / "host_overhead.html").exists()


def test_gpu_script_dry_run_on_cpu(tmp_path):
    """benchmarks/gpu/run.py --device cpu --tiny: every section's code path, on tiny random models."""
    pytest.importorskip("triton")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run.py"
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
