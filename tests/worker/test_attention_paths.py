"""The torch paged attention (grouped decodes, grouped prefill chunks) and the Triton kernel (interpreter), both
fed by ForwardBatch from a step, against a dense per-request reference, on random block tables."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import math
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from minengine.layers import cpu_attention
from minengine.layers.attention import paged_attention, write_kv
from minengine.sampling_params import SamplingParams
from minengine.worker.forward_batch import ForwardBatch

BS = 4
POISON = 1e4


def make_step(requests: list[tuple[int, int]], num_kv_heads: int, head_dim: int, seed: int):
    """A step of requests [(tokens already cached, new tokens)], their blocks scattered over a shuffled pool,
    cached K/V random, every other slot POISON: a key read without its mask would dominate the softmax. (Finite:
    the torch path reads padding slots under a mask, as the engine's zero-initialised cache allows.)"""
    gen = torch.Generator().manual_seed(seed)
    blocks = [math.ceil((c + q) / BS) for c, q in requests]
    pool = sum(blocks) + 2
    perm = torch.randperm(pool, generator=gen).tolist()
    scheduled, at = [], 0
    for i, ((ctx, q), n) in enumerate(zip(requests, blocks)):
        scheduled.append(ScheduledRequest(str(i), [1] * q, ctx, perm[at:at + n], True, q > 1, SamplingParams(), 0))
        at += n
    k_cache = torch.full((pool, BS, num_kv_heads, head_dim), POISON)
    v_cache = torch.full_like(k_cache, POISON)
    for s in scheduled:  # the context's K/V (the new tokens' are written by write_kv)
        for p in range(s.start_pos):
            b, o = s.block_ids[p // BS], p % BS
            k_cache[b, o] = torch.randn(num_kv_heads, head_dim, generator=gen)
            v_cache[b, o] = torch.randn(num_kv_heads, head_dim, generator=gen)
    return SchedulerOutput(scheduled=scheduled), k_cache, v_cache, gen


def dense_reference(step, q, k_new, v_new, k_cache, v_cache, batch, scale):
    """Per request: its K/V gathered slot by slot, causal mask, softmax in float64. Rows in batch order."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    qsl = batch.query_start_loc.tolist()
    group = q.shape[1] // k_cache.shape[2]
    for j, i in enumerate(batch.batch_order.tolist()):
        s = step.scheduled[i]
        a, b = qsl[j], qsl[j + 1]
        slots = [(s.block_ids[p // BS], p % BS) for p in range(s.seq_len)]
        k = torch.stack([k_cache[x, y] for x, y in slots]).double().repeat_interleave(group, 1)
        v = torch.stack([v_cache[x, y] for x, y in slots]).double().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[a:b].double(), k) * scale
        q_pos = torch.arange(s.start_pos, s.seq_len)[:, None]
        scores = scores.masked_fill(torch.arange(s.seq_len)[None, :] > q_pos, float("-inf"))
        out[a:b] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def run_case(requests, heads, kv_heads, head_dim, for_triton, seed=0):
    step, k_cache, v_cache, gen = make_step(requests, kv_heads, head_dim, seed)
    batch = ForwardBatch.build(step, BS, "cpu", attention_backend="triton" if for_triton else "cpu")
    t = batch.num_tokens
    q = torch.randn(t, heads, head_dim, generator=gen)
    k_new = torch.randn(t, kv_heads, head_dim, generator=gen)
    v_new = torch.randn(t, kv_heads, head_dim, generator=gen)
    write_kv(k_new, v_new, k_cache, v_cache, batch.slot_mapping)
    scale = head_dim ** -0.5
    out = paged_attention(q, k_new, v_new, k_cache, v_cache, batch, scale)
    ref = dense_reference(step, q, k_new, v_new, k_cache, v_cache, batch, scale)
    return out, ref, batch


MIXED = [(0, 6), (9, 1), (5, 3), (0, 1), (17, 1), (0, 6), (5, 3), (2, 1), (30, 1), (8, 4)]


@pytest.fixture(params=["cpu-kernel", "torch"])
def cpu_path(request, monkeypatch):
    """Each CPU test runs twice: with minengine's C++ kernel for what ``cpu_attention.use_kernel`` gives it (it must
    really be in use where a compiler exists, not silently replaced by the fallback) and with the torch path alone."""
    if request.param == "torch":
        monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
    else:
        monkeypatch.delenv(cpu_attention.ENV_SWITCH, raising=False)
        if shutil.which("c++") is None or shutil.which("ninja") is None:
            pytest.skip("no C++ compiler or ninja here: only the torch path runs")
        assert cpu_attention.get_kernel() is not None
    return request.param


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 8), (3, 3, 8), (4, 1, 16)], ids=["gqa", "mha", "mqa"])
def test_cpu_attention_matches_dense_reference(heads, kv_heads, head_dim, cpu_path):
    """Decode groups of different lengths, a fresh prefill, chunks after context; the two (0, 6) and the two
    (5, 3) requests form equal-shape prefill groups of two."""
    out, ref, batch = run_case(MIXED, heads, kv_heads, head_dim, for_triton=False)
    assert any(g.num_requests == 2 for g in batch.prefill_groups)
    assert any(g.from_start for g in batch.prefill_groups) and not all(g.from_start for g in batch.prefill_groups)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_cpu_attention_long_prefills(cpu_path):
    """Prefill chunks past the kernel's short-chunk limit: one it takes (keys <= MAX_PREFILL_KEYS, from position 0
    and after context) and ones it leaves to SDPA (more keys), in one step with decodes."""
    requests = [(0, 40), (30, 20), (560, 24), (0, 530), (3, 1), (520, 1)]
    out, ref, batch = run_case(requests, 4, 2, 8, for_triton=False, seed=7)
    kinds = {(g.from_start, cpu_attention.use_kernel(g.q_len, g.seq_len)) for g in batch.prefill_groups}
    assert kinds == {(True, True), (False, True), (False, False), (True, False)}
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 7)), min_size=1, max_size=12),
       seed=st.integers(0, 2**16))
def test_cpu_attention_random_steps(requests, seed, cpu_path):
    out, ref, _ = run_case(requests, 4, 2, 8, for_triton=False, seed=seed)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_cpu_attention_takes_a_query_whose_head_vectors_are_strided(cpu_path):
    """A query whose last dimension is not unit-stride (a transposed view): both paths give the contiguous
    query's result (the kernel path copies it, and allocates its output after the copy)."""
    step, k_cache, v_cache, gen = make_step(MIXED, 2, 8, seed=3)
    batch = ForwardBatch.build(step, BS, "cpu")
    t = batch.num_tokens
    q = torch.randn(t, 8, 4, generator=gen).transpose(1, 2)  # [T, Hq 4, D 8], last-dim stride 4
    k_new, v_new = torch.randn(t, 2, 8, generator=gen), torch.randn(t, 2, 8, generator=gen)
    write_kv(k_new, v_new, k_cache, v_cache, batch.slot_mapping)
    out = paged_attention(q, k_new, v_new, k_cache, v_cache, batch, 8 ** -0.5)
    ref = paged_attention(q.contiguous(), k_new, v_new, k_cache, v_cache, batch, 8 ** -0.5)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_triton_through_forward_batch_matches_dense_reference():
    pytest.importorskip("triton")
    out, ref, batch = run_case(MIXED, 4, 2, 8, for_triton=True)
    assert batch.block_tables is not None and not batch.decode_groups
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


# ---- the backends by name: EngineConfig.attention_backend, --attention-backend -------------------------------
GREEDY_PROMPTS = ["ROMEO:", "To be, or not to be, that is the question:", "JULIET:\nO Romeo, Romeo!"]


def _greedy_tokens(llm) -> list[list[int]]:
    from minengine.sampling_params import SamplingParams

    outs = llm.generate(GREEDY_PROMPTS, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _count_calls(monkeypatch, name: str) -> list[int]:
    """Count the calls of ``minengine.layers.attention.<name>`` (still running it)."""
    from minengine.layers import attention

    calls, real = [0], getattr(attention, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, name, counted)
    return calls


def test_reference_and_cpu_backends_give_identical_greedy_tokens(bundled_model, monkeypatch):
    """The backend named is the one that runs, in every layer of every step: "reference" never calls the C++
    kernel's wrapper, "cpu" does (where a compiler exists), and both give the same greedy tokens."""
    from minengine.engine.llm import LLM

    monkeypatch.delenv(cpu_attention.ENV_SWITCH, raising=False)
    kernel_calls = _count_calls(monkeypatch, "paged_attention_cpu")
    reference = LLM(bundled_model, attention_backend="reference", max_num_batched_tokens=16)
    assert reference.llm_engine.runner.attention_backend == "reference"
    tokens = _greedy_tokens(reference)
    assert kernel_calls[0] == 0
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler or ninja here: only the reference backend runs")
    assert cpu_attention.get_kernel() is not None  # built (or loaded) before the engine starts
    cpu = LLM(bundled_model, attention_backend="cpu", max_num_batched_tokens=16)
    assert cpu.llm_engine.runner.attention_backend == "cpu"
    assert _greedy_tokens(cpu) == tokens
    assert kernel_calls[0] > 0


def test_auto_backend_and_the_environment_switch(bundled_model, monkeypatch):
    """"auto" is resolved once, when the engine is built: the C++ kernel on a CPU, the reference with
    ``MINENGINE_CPU_KERNEL=0`` (the switch is an alias of attention_backend="reference")."""
    from minengine.engine.llm import LLM

    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
    assert LLM(bundled_model).llm_engine.runner.attention_backend == "reference"
    monkeypatch.delenv(cpu_attention.ENV_SWITCH)
    assert LLM(bundled_model).llm_engine.runner.attention_backend == "cpu"


@settings(max_examples=30, deadline=None)
@given(name=st.text(max_size=12).filter(lambda s: s not in ("auto", "reference", "cpu", "triton")))
def test_an_unknown_backend_is_an_error_naming_the_field_and_the_choices(name):
    from minengine.config import EngineConfig
    from minengine.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="attention_backend") as info:
        EngineConfig(attention_backend=name)
    assert all(choice in str(info.value) for choice in ("reference", "cpu", "triton", "auto"))


def test_attention_backend_flag_on_every_command():
    """``--attention-backend`` (vLLM's flag) reaches EngineConfig on run, generate, bench-serve and serve;
    argparse refuses a name not in the choices."""
    from minengine.__main__ import _config, build_parser

    parser = build_parser()
    for command in (["run"], ["generate", "x"], ["bench-serve"], ["serve"]):
        args = parser.parse_args(command + ["--attention-backend", "reference"])
        if command[0] != "serve":
            assert _config(args).attention_backend == "reference"
        assert args.attention_backend == "reference"
        with pytest.raises(SystemExit):
            parser.parse_args(command + ["--attention-backend", "flash"])
