"""Weight-only int8 (quantization="int8"): per-output-channel quantization, the int8 matmul (torch's packed kernel
and dequantize-then-matmul) against dequantize-then-matmul, the decode steps on the packed kernel, tensor-parallel
shards, loading, bad values; the modelled clock pricing int8 weights and fp8 KV."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine import LLM, EngineArgs, EngineConfig, SamplingParams
from minengine.config import QUANTIZATIONS
from minengine.layers import quantization as q8
from minengine.timing import LLAMA_3_8B, ClockSpec, StepCostModel
from minengine.timing.clocks import shape_for_engine
from minengine.viz.runner import DashboardConfig, WorkloadRun
from minengine.viz.workload import Workload, WorkloadRequest


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 40), seed=st.integers(0, 2**16),
       magnitude=st.sampled_from([1e-3, 1.0, 300.0]))
def test_quantize_int8_error_is_at_most_half_a_step_per_channel(rows, cols, seed, magnitude):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * magnitude
    w[0] = 0.0  # an all-zero channel
    qweight, scale = q8.quantize_int8(w)
    assert qweight.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (rows,)
    assert qweight.abs().max() <= 127 and scale[0] == 1.0 and (qweight[0] == 0).all()
    err = (q8.dequantize_int8(qweight, scale) - w).abs()
    assert (err <= scale[:, None] * 0.5 * (1 + 1e-5)).all()  # round to nearest: half a step at most
    assert (qweight[1:].abs().amax(dim=1) == 127).all()  # each nonzero channel's largest weight uses the range


@pytest.mark.parametrize("dtype,rows,width,packed", [
    (torch.float32, 1, 64, True), (torch.float32, q8.INT8PACK_MAX_ROWS, 48, True),
    (torch.float32, q8.INT8PACK_MAX_ROWS + 1, 64, False), (torch.float32, 40, 64, False),
    (torch.bfloat16, 1, 64, True), (torch.bfloat16, q8.INT8PACK_MAX_ROWS, 48, True),
    (torch.bfloat16, q8.INT8PACK_MAX_ROWS + 1, 64, False), (torch.bfloat16, 2, 24, False),
    (torch.bfloat16, 3, 100, False), (torch.float16, 3, 64, False)])
def test_int8_linear_equals_dequantize_then_matmul(dtype, rows, width, packed):
    """Both kernels ``int8_linear`` chooses between (torch's packed one where ``uses_int8pack``: CPU float32 or
    bfloat16, few rows, a width it computes right; the reference dequantize-then-matmul otherwise) against float64
    dequantize-then-matmul."""
    g = torch.Generator().manual_seed(rows)
    w, bias = torch.randn(96, width, generator=g), torch.randn(96, generator=g)
    x = torch.randn(rows, width, generator=g).to(dtype)
    qweight, scale = q8.quantize_int8(w)
    assert q8.uses_int8pack(x) == packed
    got = q8.int8_linear(x, qweight, scale, bias.to(dtype))
    want = x.double() @ q8.dequantize_int8(qweight, scale, torch.float64).T + bias.to(dtype).double()
    assert got.dtype == dtype and got.shape == (rows, 96)
    # float32 through the packed kernel is computed from bfloat16 activations and sums (int8pack_matmul)
    tol = 1e-4 if dtype == torch.float32 and not packed else 5e-2 if dtype == torch.float16 else 1e-2
    torch.testing.assert_close(got.double(), want, atol=tol * want.abs().max().item(), rtol=tol)
    # [..., in] inputs keep their leading dimensions
    assert q8.int8_linear(x.view(1, rows, width), qweight, scale).shape == (1, rows, 96)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, q8.INT8PACK_MAX_ROWS), in_blocks=st.integers(1, 12), out_features=st.integers(1, 97),
       leading=st.sampled_from([(), (1,)]), with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_int8pack_matmul_equals_the_reference_on_random_shapes(rows, in_blocks, out_features, leading, with_bias,
                                                               seed):
    """The fast path (``int8pack_matmul``: float32 activations cast to bfloat16 for torch's packed kernel, the
    float32 scales applied to its output) gives the reference ``int8_matmul``'s float32 result within bfloat16's
    rounding, for 1 to 16 rows, any number of outputs (odd ones included), widths that are multiples of 16, with and
    without a bias; an error of one quantization step in a weight, a scale left out or a bias added twice is
    far outside this tolerance."""
    g = torch.Generator().manual_seed(seed)
    width = in_blocks * q8.INT8PACK_WIDTH_MULTIPLE
    qweight, scale = q8.quantize_int8(torch.randn(out_features, width, generator=g) * 0.05)
    bias = torch.randn(out_features, generator=g) if with_bias else None
    x = torch.randn(*leading, rows, width, generator=g)
    assert q8.uses_int8pack(x)
    got = q8.int8pack_matmul(x, qweight, scale, bias)
    want = q8.int8_matmul(x, qweight, scale, bias)
    assert got.dtype == torch.float32 and got.shape == want.shape == (*leading, rows, out_features)
    assert torch.equal(q8.int8_linear(x, qweight, scale, bias), got)  # the door takes the fast path here
    # bfloat16 keeps 8 significant bits: the activations' and each sum's rounding, relative 2^-9 each
    limit = 2.0 ** -7 * (x.abs() @ q8.dequantize_int8(qweight, scale).abs().T)
    assert ((got - want).abs() <= limit).all(), (got - want).abs().max()


@pytest.mark.parametrize("x", [torch.ones(2, 24), torch.ones(q8.INT8PACK_MAX_ROWS + 1, 32),
                               torch.ones(2, 32, dtype=torch.float16), torch.ones(0, 32)])
def test_int8pack_matmul_refuses_what_its_kernel_cannot_take(x):
    """Widths that are not a multiple of 16 (wrong sums or a crash in torch's kernel), more rows than the fast
    path is for, float16, no rows: a ValueError that names the input and the way out, before the kernel runs."""
    qweight, scale = q8.quantize_int8(torch.randn(8, x.shape[-1]))
    assert not q8.uses_int8pack(x)
    with pytest.raises(ValueError, match=r"x .* is not an input the packed int8 kernel takes .* use int8_matmul"):
        q8.int8pack_matmul(x, qweight, scale)
    assert q8.int8_linear(x, qweight, scale).shape == (*x.shape[:-1], 8)  # the door takes the reference


def test_int8_decodes_take_the_packed_kernel_and_prefills_the_reference(bundled_model, monkeypatch):
    """End to end on the bundled model (float32, widths 256 and 688): greedy int8 generation runs its decode
    steps through ``int8pack_matmul`` (1 row per layer call) and its prefill through the reference (more rows than
    ``INT8PACK_MAX_ROWS``), and its first tokens are the float32 model's."""
    calls = {"packed": 0, "reference": 0}
    packed, reference = q8.int8pack_matmul, q8.int8_matmul

    def count(name, fn):
        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return counted

    monkeypatch.setattr(q8, "int8pack_matmul", count("packed", packed))
    monkeypatch.setattr(q8, "int8_matmul", count("reference", reference))
    prompt = {"prompt_token_ids": list(range(3, 3 + 2 * q8.INT8PACK_MAX_ROWS))}
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm = LLM(bundled_model, quantization="int8")
    layers = 7 * len(llm.llm_engine.model.model.layers)
    quantized = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert calls == {"packed": 5 * layers, "reference": layers}  # 1 prefill, 5 decodes
    full = LLM(bundled_model).generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert len(quantized) == 6 and quantized[:2] == full[:2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("linear", ["int8_linear", "int8_matmul"])
def test_int8_shards_recombine_to_the_whole_layer(dtype, linear):
    """Column-parallel shards (output channels with their scales) concatenate, row-parallel ones (input features,
    all scales) sum, to the unsharded layer's output (what TP ranks all-gather / all-reduce); through the door
    (here the packed kernel, whose partial sums are rounded to bfloat16 one by one) and the reference."""
    fn = getattr(q8, linear)
    g = torch.Generator().manual_seed(0)
    qweight, scale = q8.quantize_int8(torch.randn(32, 64, generator=g))
    x = torch.randn(3, 64, generator=g).to(dtype)  # shards 16 wide: the packed kernel's for these 3 rows
    assert q8.uses_int8pack(x[:, :16])
    whole = fn(x, qweight, scale).double()
    column = torch.cat([fn(x, *q8.shard_int8(qweight, scale, 0, r, 4)) for r in range(4)], dim=-1)
    torch.testing.assert_close(column.double(), whole, atol=1e-5, rtol=1e-5)
    row = sum(fn(x[:, r * 16:(r + 1) * 16], *q8.shard_int8(qweight, scale, 1, r, 4)).double() for r in range(4))
    tol = 1e-5 if dtype == torch.float32 and linear == "int8_matmul" else 3e-2
    torch.testing.assert_close(row, whole, atol=tol * whole.abs().max().item(), rtol=tol)
    with pytest.raises(ValueError, match="dim must be 0"):
        q8.shard_int8(qweight, scale, 2, 0, 2)
    with pytest.raises(ValueError, match="cannot give rank 0 of 5"):
        q8.shard_int8(qweight, scale, 0, 0, 5)


def test_quantize_int8_refuses_what_it_cannot_quantize():
    with pytest.raises(ValueError, match="2-D float"):
        q8.quantize_int8(torch.ones(3, dtype=torch.float32))
    with pytest.raises(ValueError, match="inf or NaN"):
        q8.quantize_int8(torch.tensor([[1.0, float("nan")]]))


def test_int8_loading_quantizes_the_decoder_linears(random_qwen2):
    """A Qwen2 (q/k/v biases, tied embeddings): every decoder linear becomes Int8Linear with its bias; embeddings
    and the LM head stay float; the greedy output is close to the float model's (the first tokens agree)."""
    prompt = {"prompt_token_ids": list(range(5, 30))}
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm = LLM(random_qwen2, quantization="int8")
    model = llm.llm_engine.model
    layers = [m for m in model.modules() if isinstance(m, q8.Int8Linear)]
    assert len(layers) == 7 * len(model.model.layers)
    assert all(m.qweight.dtype == torch.int8 for m in layers)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    assert not any(isinstance(m, torch.nn.Linear) for m in model.model.layers.modules())
    assert model.lm_head.weight.dtype == torch.float32
    quantized = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    full = LLM(random_qwen2).generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert quantized[0] == full[0]


@pytest.mark.parametrize("bad", ["gptq", "awq", "fp8", "INT8", 8, ""])
def test_bad_quantization_is_a_value_error(bad):
    with pytest.raises(ValueError, match=r"quantization must be one of \(None, 'int8', 'experts_int8'\) "
                                         r"\('experts_int8' is vLLM's name for minengine's 'int8'"):
        EngineConfig(quantization=bad)
    with pytest.raises(ValueError, match="quantization"):
        EngineArgs(quantization=bad).create_engine_config()
    assert QUANTIZATIONS == (None, *q8.QUANTIZATION_METHODS)


def test_cost_model_prices_int8_weights_and_fp8_kv():
    """Weight-only int8 halves the decoder weights' bytes against bfloat16 (the LM head and the activations keep 2
    bytes, so the compute peak is bfloat16's); fp8 KV halves the KV bytes."""
    decode = [(1, 2047, 1)] * 32
    base = StepCostModel("h100", LLAMA_3_8B).cost(decode)
    int8 = StepCostModel("h100", shape_for_engine(LLAMA_3_8B, quantization="int8")).cost(decode)
    fp8 = StepCostModel("h100", shape_for_engine(LLAMA_3_8B, kv_cache_dtype="fp8")).cost(decode)
    lm_head = LLAMA_3_8B.lm_head_params * 2
    assert int8.weight_bytes == pytest.approx((base.weight_bytes - lm_head) / 2 + lm_head)
    assert int8.kv_bytes == base.kv_bytes and int8.flops == base.flops and int8.compute_time_s == base.compute_time_s
    assert fp8.kv_bytes == pytest.approx(base.kv_bytes / 2) and fp8.weight_bytes == base.weight_bytes
    assert base.time_s > int8.time_s and base.time_s > fp8.time_s  # memory-bound decodes get faster
    both = shape_for_engine("llama-3-8b", "fp8", "int8")
    assert both.name == "Llama-3-8B, fp8 KV, int8 weights" and shape_for_engine(LLAMA_3_8B) is LLAMA_3_8B
    assert both.weight_bytes < LLAMA_3_8B.weight_bytes == LLAMA_3_8B.num_params * 2
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        ClockSpec("modelled", kv_cache_dtype="fp4")
    with pytest.raises(ValueError, match="quantization must be one of"):
        ClockSpec("modelled", quantization="gptq")


def test_dashboard_clock_prices_the_engine_dtypes(bundled_model):
    """The dashboard's run with fp8 KV and int8 weights: the engine really runs them, and its modelled clock's
    shape carries them, so the same decode-heavy workload takes less modelled time."""
    reqs = tuple(WorkloadRequest(f"r{i}", tuple(range(3, 40)), max_tokens=12) for i in range(4))
    workload = Workload("decode-heavy", reqs)
    durations = {}
    for kv, quant in (("auto", None), ("fp8", "int8")):
        run = WorkloadRun(DashboardConfig(kv_cache_dtype=kv, quantization=quant), workload)
        assert run.clock.cost_model.shape == shape_for_engine("llama-3-8b", kv, quant)
        assert run.engine.runner.kv_caches[0][0].dtype == (torch.float8_e4m3fn if kv == "fp8" else torch.float32)
        while run.step() is not None:
            pass
        assert run.num_finished == 4
        durations[kv] = run.clock()
    assert 0 < durations["fp8"] < durations["auto"]


def test_quantization_benchmark_tiny(tmp_path):
    """benchmarks/quantization.py on tiny settings: every section's rows, the fp8 pool 4x the float32 one, int8
    weights and fp8 KV both faster on the modelled H100, the decode section's two engines on one layer of
    SmolLM-135M's shape (its timings are not checked)."""
    from minengine.workloads import find_data_dir

    if find_data_dir(None) is None:
        pytest.skip("Tiny Shakespeare (shared/data) not found: set MINENGINE_DATA")
    from benchmarks import quantization as bench

    result = bench.main(["--windows", "2", "--calibration-windows", "1", "--prompts", "2", "--max-tokens", "4",
                         "--repeats", "1", "--budget-mib", "4", "--decode-layers", "1", "--decode-prompt-len", "16",
                         "--decode-tokens", "3", "--decode-repeats", "1", "--decode-windows", "1", "--write",
                         "--out", str(tmp_path / "q.md")])
    assert [r["mode"] for r in result["quality"]] == list(bench.MODES)
    ref = result["quality"][0]
    assert ref["token_agreement"] == 1.0 and ref["identical"] == 2 and 1 < ref["perplexity"] < 2048
    assert all(abs(r["perplexity"] / ref["perplexity"] - 1) < 0.05 for r in result["quality"])
    bundled = {(r["dtype"], r["kv_cache_dtype"]): r["num_blocks"] for r in result["blocks"] if r["model"] == "bundled"}
    assert bundled[("float32", "fp8")] == 4 * bundled[("float32", "auto")] == 2 * bundled[("bfloat16", "auto")]
    steps = [r["step_ms_batch_64"] for r in result["modelled"]]
    assert steps[0] > max(steps[1], steps[2]) and min(steps[1], steps[2]) > steps[3]
    assert "| fp8 KV + int8 weights |" in (tmp_path / "q.md").read_text()
    decode = result["decode"]["rows"]  # SmolLM-135M's shape, 1 layer: the float32 LM head is most of the bytes
    assert [r["mode"] for r in decode] == list(bench.DECODE_MODES) and decode[0]["cpu_speedup"] == 1.0
    assert decode[1]["weight_mb"] < decode[0]["weight_mb"]
    assert all(r["cpu_ms"] > 0 and r["decoder_linear_ms"] > 0 and r["lm_head_ms"] > 0 for r in decode)
    assert abs(decode[1]["perplexity_change"]) < 0.05 and decode[0]["perplexity"] > 1000  # random weights
    assert "## Decode on SmolLM-135M's shape" in (tmp_path / "q.md").read_text()


def test_docs_modelled_step_table_is_the_cost_model_today():
    """docs/features/quantization.md's "Llama-3-8B, H100" table is what ``benchmarks/quantization.py``'s
    ``modelled`` computes now: a refit of the cost model left it stale once (8.02 / 15.23 ms against 7.66 / 22.29)."""
    import argparse
    import re
    from pathlib import Path

    from benchmarks import quantization

    readme = (Path(__file__).resolve().parents[2] / "docs" / "features" / "quantization.md").read_text()
    names = {("auto", None): "bfloat16", ("fp8", None): "fp8 KV", ("auto", "int8"): "int8 weights",
             ("fp8", "int8"): "fp8 KV + int8 weights"}
    for row in quantization.modelled(argparse.Namespace(context=2048, batch=64)):
        name = names[(row["kv_cache_dtype"], row["quantization"])]
        cells = r" \| ([\d.]+)" * 4
        line = re.search(r"^\| " + re.escape(name) + cells + r" \|", readme, re.M)
        assert line, name
        want = [f"{row[k]:.2f}" for k in ("weight_gb", "kv_gb", "step_ms_batch_1", "step_ms_batch_64")]
        assert list(line.groups()) == want, (name, line.groups(), want)
