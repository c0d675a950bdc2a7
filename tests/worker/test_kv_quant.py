"""The FP8 KV cache (kv_cache_dtype="fp8"): written as float8 e4m3 with per-tensor scales and read back, dequantized,
by every attention path (torch, the C++ CPU kernel, the Triton kernel through its interpreter); greedy output the
same on every path; the pool holds 4x the float32 blocks (2x the bfloat16 ones) in the same memory."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import shutil

import pytest
import torch

from minengine import LLM, EngineArgs, EngineConfig, SamplingParams
from minengine.config import KV_CACHE_DTYPES
from minengine.layers import cpu_attention, kv_quant
from minengine.layers.attention import paged_attention, write_kv
from minengine.worker.forward_batch import ForwardBatch
from minengine.worker.model_runner import ModelRunner, kv_bytes_per_block
from tests.worker.test_attention_paths import BS, MIXED, dense_reference, make_step

E4M3_REL = 2.0 ** -4  # half a unit in the last place of a 3-bit mantissa, relative
E4M3_SUBNORMAL_ABS = 2.0 ** -10  # half the spacing of e4m3's subnormals (2^-9), absolute (times the scale)
PATHS = ["torch", "cpu-kernel", "triton"]


def use_path(path: str, monkeypatch) -> None:
    """Select an attention path for the CPU tests (the Triton one is chosen by building the batch for it)."""
    if path == "torch":
        monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
        return
    monkeypatch.delenv(cpu_attention.ENV_SWITCH, raising=False)
    if path == "cpu-kernel":
        if shutil.which("c++") is None or shutil.which("ninja") is None:
            pytest.skip("no C++ compiler or ninja here: only the torch path runs")
        assert cpu_attention.get_kernel() is not None
    else:
        pytest.importorskip("triton")


def test_accepted_names_agree():
    assert tuple(kv_quant.KV_CACHE_DTYPES) == KV_CACHE_DTYPES
    assert kv_quant.kv_cache_torch_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_quant.kv_cache_torch_dtype("fp8", torch.float32) == torch.float8_e4m3fn


@pytest.mark.parametrize("path,scales", [(p, s) for p in PATHS for s in ((1.0, 1.0), (0.02, 0.5))
                                          if p != "triton" or s != (1.0, 1.0)])  # the interpreter is slow
def test_fp8_cache_round_trip_on_every_attention_path(path, scales, monkeypatch):
    """K/V written to an FP8 cache come back within e4m3's rounding error, and each attention path's output equals
    exact attention over the dequantized cache (float64) and is within FP8 error of the float32 cache's. The step
    mixes decodes, prefills from position 0 (which the torch path attends without reading the cache) and chunks
    after cached context."""
    use_path(path, monkeypatch)
    k_scale, v_scale = scales
    step, k32, v32, gen = make_step(MIXED, 2, 8, seed=1)
    k8, v8 = kv_quant.quantize_kv(k32, k_scale), kv_quant.quantize_kv(v32, v_scale)  # the cached context
    batch = ForwardBatch.build(step, BS, "cpu", attention_backend="triton" if path == "triton" else "cpu")
    t = batch.num_tokens
    q = torch.randn(t, 4, 8, generator=gen)
    k_new, v_new = torch.randn(t, 2, 8, generator=gen), torch.randn(t, 2, 8, generator=gen)
    write_kv(k_new, v_new, k8, v8, batch.slot_mapping, k_scale, v_scale)
    write_kv(k_new, v_new, k32, v32, batch.slot_mapping)
    assert k8.dtype == torch.float8_e4m3fn

    for new, cache, s in ((k_new, k8, k_scale), (v_new, v8, v_scale)):
        stored = kv_quant.dequantize_kv(cache.view(-1, 2, 8)[batch.slot_mapping], s, torch.float32)
        assert ((stored - new).abs() <= E4M3_REL * new.abs() + E4M3_SUBNORMAL_ABS * s).all()

    scale = 8 ** -0.5
    out = paged_attention(q, k_new, v_new, k8, v8, batch, scale, k_scale, v_scale)
    k_read = kv_quant.dequantize_kv(k8, k_scale, torch.float32)
    v_read = kv_quant.dequantize_kv(v8, v_scale, torch.float32)
    exact = dense_reference(step, q, k_new, v_new, k_read, v_read, batch, scale)
    torch.testing.assert_close(out.double(), exact, atol=1e-5, rtol=1e-5)
    full = dense_reference(step, q, k_new, v_new, k32, v32, batch, scale)
    assert (out.double() - full).abs().max() < 0.1  # e4m3 keeps ~2 significant digits: close, not equal
    assert (out.double() - full).abs().max() > 0  # and it really was quantized


def test_quantize_saturates_instead_of_nan():
    x = torch.tensor([1e6, -1e6, 500.0, 448.0, 1.0, 0.0])
    assert kv_quant.quantize_kv(x, 1.0).float().tolist() == [448.0, -448.0, 448.0, 448.0, 1.0, 0.0]
    # 500 / 4 = 125 rounds to 128 (e4m3's spacing is 8 there)
    assert kv_quant.quantize_kv(x, 4.0).float().tolist() == [448.0, -448.0, 128.0, 112.0, 0.25, 0.0]


def test_cpu_kernel_reads_every_fp8_value_exactly():
    """The kernel's float8 -> float32 decoding (integer arithmetic, no table) against torch's conversion, for all
    254 finite e4m3fn bit patterns (subnormals, both zeros, the largest): one key per request, so the output row
    is that request's value row times v_scale."""
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler or ninja here")
    kernel = cpu_attention.get_kernel()
    assert kernel is not None
    finite = [b for b in range(256) if b & 0x7F != 0x7F]  # 0x7f and 0xff are NaN
    codes = torch.tensor(finite + [0x00, 0x80], dtype=torch.uint8)  # 256 = 16 requests x [1 slot, Hkv 2, D 8]
    n = 16
    v_cache = codes.view(n, 1, 2, 8).view(torch.float8_e4m3fn)
    k_cache = torch.zeros_like(v_cache)
    query = torch.randn(n, 4, 8)
    out = torch.empty_like(query)
    tables = torch.arange(n).view(n, 1)
    kernel(out, query, k_cache, v_cache, tables, torch.ones(n, dtype=torch.int32), 1, 0.3, 1, 1.0, 2.0)
    expected = (v_cache.float() * 2.0).reshape(n, 2, 8).repeat_interleave(2, dim=1)  # GQA: 2 query heads each
    assert torch.equal(out, expected)


def _greedy(llm: LLM, prompts, n: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_greedy_fp8_kv_and_int8_equal_on_every_attention_path(random_llama, monkeypatch):
    """fp8 KV (with scales other than 1, so each path must apply them) + int8 weights: the same greedy tokens through
    the torch path, the C++ kernel and the Triton kernel (interpreter). An 8-token budget splits the prompts into
    chunks that read the FP8 cache beside decodes. (A random model: the interpreter runs one Python program per
    token and head, too slow for more.)"""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (14, 5, 9)]
    kwargs = dict(kv_cache_dtype="fp8", quantization="int8", max_num_batched_tokens=8, max_model_len=64,
                  num_kv_blocks=16)
    results = {}
    for path in PATHS:
        use_path(path, monkeypatch)
        llm = LLM(random_llama, **kwargs)
        e = llm.llm_engine
        kv_quant.set_kv_scales(e.model, [(0.05, 0.02), (0.03, 0.01)])
        if path == "triton":
            e.runner = ModelRunner(e.model, e.num_kv_blocks, e.config.block_size, attention_backend="triton",
                                   kv_cache_dtype=torch.float8_e4m3fn)
        assert all(k.dtype == torch.float8_e4m3fn for k, _ in e.runner.kv_caches)
        results[path] = _greedy(llm, prompts, 5)
        assert e.kv_cache_manager.num_free_blocks == e.num_kv_blocks
    assert results["torch"] == results["cpu-kernel"] == results["triton"]


def test_fp8_swap_preemption_keeps_the_output(bundled_model):
    """Swap preemption copies FP8 blocks out and back byte for byte: the output equals a run without preemption."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 2048, (40,), generator=g).tolist() for _ in range(4)]
    roomy = _greedy(LLM(bundled_model, kv_cache_dtype="fp8", max_model_len=96, num_kv_blocks=64), prompts, 24)
    llm = LLM(bundled_model, kv_cache_dtype="fp8", max_model_len=96, num_kv_blocks=12, preemption_mode="swap")
    assert _greedy(llm, prompts, 24) == roomy
    e = llm.llm_engine
    assert e.runner.swap_space.caches[0][0].dtype == torch.float8_e4m3fn
    assert sum(t.num_swapped_out_blocks for t in e.traces) > 0 and sum(t.num_swapped_in_blocks for t in e.traces) > 0
    assert e.kv_cache_manager.num_free_blocks == e.num_kv_blocks


@pytest.mark.parametrize("dtype,ratio", [("float32", 4), ("bfloat16", 2)])
def test_fp8_pool_holds_more_blocks_in_the_same_memory(bundled_model, dtype, ratio):
    budget = 4 * 2**20
    auto = LLM(bundled_model, dtype=dtype, kv_cache_memory_bytes=budget).llm_engine
    fp8 = LLM(bundled_model, dtype=dtype, kv_cache_memory_bytes=budget, kv_cache_dtype="fp8").llm_engine
    per_block = kv_bytes_per_block(fp8.model, 16, torch.float8_e4m3fn)
    assert kv_bytes_per_block(auto.model, 16, auto.runner.dtype) == ratio * per_block
    assert fp8.num_kv_blocks == budget // per_block == ratio * auto.num_kv_blocks
    assert fp8.kv_cache_manager.num_free_blocks == fp8.num_kv_blocks  # the scheduler's pool is the larger one
    assert fp8.runner.kv_caches[0][0].shape[0] == fp8.num_kv_blocks
    assert sum(k.numel() * k.element_size() * 2 for k, _ in fp8.runner.kv_caches) == fp8.kv_cache_bytes <= budget


@pytest.mark.parametrize("bad", ["fp4", "fp8_e5m2", "float8", 8, None])
def test_bad_kv_cache_dtype_is_a_value_error(bad):
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', 'fp8', 'fp8_e4m3'\)"):
        EngineConfig(kv_cache_dtype=bad)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineArgs(kv_cache_dtype=bad).create_engine_config()


def test_set_kv_scales_checks_its_input(bundled_model):
    model = LLM(bundled_model).llm_engine.model
    kv_quant.set_kv_scales(model, [(0.5, 2.0)] * 4)
    assert (model.model.layers[3].self_attn.k_scale, model.model.layers[3].self_attn.v_scale) == (0.5, 2.0)
    with pytest.raises(ValueError, match="one \\(k_scale, v_scale\\) per layer"):
        kv_quant.set_kv_scales(model, [(1.0, 1.0)])
    with pytest.raises(ValueError, match="k_scale must be a positive finite number"):
        kv_quant.set_kv_scales(model, [(0.0, 1.0)] * 4)
    assert kv_quant.calibrated_kv_scales([(448.0, 0.0), (8.96, 4.48)]) == [(1.0, 1.0), (8.96 / 448, 0.01)]
    assert kv_quant.calibrated_kv_scales([(4.48, 4.48)], headroom=2.0) == [(0.02, 0.02)]
