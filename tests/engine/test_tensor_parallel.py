"""Tensor parallelism on the CPU: N worker processes over torch.distributed (gloo), one scheduler.

Greedy tokens equal TP=1 (the in-process engine) and transformers, on the bundled model (TP 2 with async
scheduling; tied LM head, KV heads 2 -> 1 per rank) and on a random Llama with 8 query / 4 KV heads and a
vocabulary that does not divide by the ranks (TP 2 and TP 4, untied LM head), with chunked prefill, prefix-cache
hits and preemptions in the same run. A float32 all-reduce adds in another order than one matmul: a token may
differ only where the top-2 logits are closer than ``MARGIN`` (checked, never skipped). Also: int8 weights + an
fp8 KV cache over 2 ranks with one KV head (replicated on both) give TP 1's tokens; the collectives a step runs
(counted in every worker) equal what ``StepCostModel`` charges for it; a worker that raises or dies makes the
engine raise within seconds; shutdown leaves no process; bad sizes are ValueErrors before any process starts.

Each engine start starts processes (seconds each on a loaded 2-core machine), so every engine serves several
checks: four worker engines in all.

The machine has 2 cores: TP 2 runs 2 gloo processes; TP 4 runs 4 on the 2 cores with
``allow_cpu_oversubscription=True`` (refused without it, tested below). Workers are forked (vLLM's default;
``tests/engine/test_worker_start_method.py`` covers spawn); spawned ones get this process's ``sys.path`` (the checkout's
minengine; a worker that imports another copy refuses to start).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import psutil
import pytest
import torch

from minengine import LLM, SamplingParams
from minengine.config import EngineConfig
from minengine.executor import WorkerFailedError
from minengine.timing.cost_model import StepCostModel, StepWork
from minengine.timing.hardware import H100_SXM
from minengine.timing.model_shape import get_model_shape
from tests.conftest import _save_random_model, hf_greedy, hf_model

MARGIN = 1e-4
MAX_NEW = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
# Chunked prefill (64-token budget), prefix caching (a shared 48-token prefix) and preemption (24 blocks of 16
# for ~650 tokens of prompts) in one run.
WORKLOAD = dict(max_num_batched_tokens=64, num_kv_blocks=24, max_num_seqs=6, enable_prefix_caching=True,
                max_model_len=512)


@pytest.fixture(scope="module")
def random_tp_model(tmp_path_factory) -> str:
    """A random Llama with 8 query heads, 4 KV heads, vocabulary 509 (not a multiple of 2 or 4), no tokenizer."""
    return _random_llama(tmp_path_factory, num_kv_heads=4)


@pytest.fixture(scope="module")
def random_one_kv_head_model(tmp_path_factory) -> str:
    """The same with one KV head: at TP 2 each rank holds a copy of it (replicated, as vLLM)."""
    return _random_llama(tmp_path_factory, num_kv_heads=1)


def _random_llama(tmp_path_factory, num_kv_heads: int) -> str:
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=509, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=num_kv_heads, max_position_embeddings=1024,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    return _save_random_model(cfg, tmp_path_factory.mktemp(f"llama_8_{num_kv_heads}"), seed=3)


def workload_prompts(stream: list[int]) -> list[list[int]]:
    shared = stream[:48]
    return [shared + stream[100:140], stream[200:201], shared + stream[300:420], stream[400:600],
            shared + stream[600:607], stream[700:730], shared]


@pytest.fixture(scope="module")
def bundled_stream(bundled_model) -> list[int]:
    from transformers import AutoTokenizer

    from tests.prompts import TEXT

    ids = AutoTokenizer.from_pretrained(bundled_model)(TEXT)["input_ids"]  # 384 tokens
    return (ids * 3)[:800]


@pytest.fixture(scope="module")
def random_stream() -> list[int]:
    return torch.randint(3, 509, (800,), generator=torch.Generator().manual_seed(0)).tolist()


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def assert_same_greedy(model: str, prompt: list[int], got: list[int], ref: list[int], what: str) -> None:
    """``got == ref``, or they first differ at a near-tie: transformers' top-2 logits there within ``MARGIN``."""
    if got == ref:
        return
    i = next(j for j, (a, b) in enumerate(zip(got, ref)) if a != b)
    with torch.no_grad():
        logits = hf_model(model)(torch.tensor([prompt + ref[:i]])).logits[0, -1]
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap < MARGIN, f"{what}: token {i} is {got[i]}, not {ref[i]}, with a top-2 logit gap of {gap:.2e}"


def generate(llm: LLM, prompts: list[list[int]], params=GREEDY) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def check_against_tp1_and_hf(model: str, prompts: list[list[int]], llm: LLM) -> None:
    """``llm``'s greedy tokens on ``prompts`` against TP 1 and transformers; the run had chunked prefill, prefix
    hits and preemptions, and left every block free."""
    engine = llm.llm_engine
    got = generate(llm, prompts)
    tp1 = generate(LLM(model, **WORKLOAD), prompts)
    for prompt, g, t in zip(prompts, got, tp1):
        assert_same_greedy(model, prompt, g, t, "vs TP=1")
        assert_same_greedy(model, prompt, g, hf_greedy(model, tuple(prompt), MAX_NEW), "vs transformers")
    summary = engine.summary()
    assert summary.num_preemptions > 0
    assert any(t.prefix_hit_tokens for t in engine.traces)
    assert any(t.num_prefill_tokens and t.num_decode_tokens for t in engine.traces)  # a chunk beside decodes
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


@pytest.fixture(scope="module")
def bundled_tp2_async(bundled_model):
    llm = LLM(bundled_model, tensor_parallel_size=2, async_scheduling=True, **WORKLOAD)
    yield llm
    llm.llm_engine.shutdown()


def test_bundled_model_tp2_with_async_scheduling_matches_tp1_and_transformers(bundled_model, bundled_stream,
                                                                              bundled_tp2_async):
    """Two ranks, async scheduling on: the placeholders are filled by every rank from its own sampled tokens."""
    engine = bundled_tp2_async.llm_engine
    assert len(engine.runner.worker_pids) == 2 and engine.model is None
    check_against_tp1_and_hf(bundled_model, workload_prompts(bundled_stream), bundled_tp2_async)


def test_collectives_per_step_equal_the_cost_model(bundled_model, bundled_tp2_async):
    """Counted in every worker (``TensorParallelGroup``): the all-reduces (2 per layer over [tokens, hidden]) are
    ``StepCostModel.allreduce_count_and_bytes`` of the step's work, and the LM head's one all-gather of
    [sampled rows, vocab] runs only in a step with sampling rows (the cost model's logits term)."""
    engine = bundled_tp2_async.llm_engine
    # the checkpoint's shapes at the engine's float32 (the modelled GPU would reduce 16-bit activations)
    shape = dataclasses.replace(get_model_shape(bundled_model), dtype_bytes=4)
    cost_model = StepCostModel(H100_SXM, shape, tp=2)
    vocab = engine.hf_config.vocab_size
    engine.add_request("long", {"prompt_token_ids": list(range(3, 150))}, SamplingParams(max_tokens=3))
    engine.add_request("short", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4))
    seen, num_traces = set(), len(engine.traces)
    while engine.has_unfinished_requests():
        engine.step()
        if len(engine.traces) == num_traces:  # async scheduling: a call that only submitted
            continue
        num_traces = len(engine.traces)
        trace = engine.traces[-1]
        work = StepWork.from_step_trace(trace)
        count, nbytes = cost_model.allreduce_count_and_bytes(work)
        rows = sum(c.sampled for c in trace.chunks)
        for reply in engine.runner.last_replies:
            assert (reply.num_all_reduces, reply.all_reduce_bytes) == (count, nbytes), f"step {trace.step}"
            assert (reply.num_all_gathers, reply.all_gather_bytes) == ((1, rows * vocab * 4) if rows else (0, 0))
        assert count == 2 * engine.hf_config.num_hidden_layers
        seen.add(rows > 0)
    assert seen == {True, False}  # steps with and without the LM head


def test_random_model_tp2_matches_and_a_collected_engine_leaves_no_process(random_tp_model, random_stream):
    """8 query / 4 KV heads over 2 ranks (vocabulary 509: uneven LM-head slices); then the engine is dropped
    without ``shutdown()``: garbage collection stops its workers."""
    before = children()
    llm = LLM(random_tp_model, tensor_parallel_size=2, **WORKLOAD)
    assert len(children() - before) == 2
    check_against_tp1_and_hf(random_tp_model, workload_prompts(random_stream), llm)
    del llm
    import gc

    gc.collect()
    assert children() - before == set()


def test_random_model_tp4_matches_then_a_worker_that_dies_stops_the_engine(random_tp_model, random_stream):
    """4 ranks on this machine's 2 cores (``allow_cpu_oversubscription``); then one is killed: the next steps
    raise ``WorkerFailedError`` within seconds, and shutdown leaves no process."""
    before = children()
    llm = LLM(random_tp_model, tensor_parallel_size=4, allow_cpu_oversubscription=True, **WORKLOAD)
    engine = llm.llm_engine
    try:
        pids = engine.runner.worker_pids
        assert len(pids) == 4 and set(pids) <= children() - before
        check_against_tp1_and_hf(random_tp_model, workload_prompts(random_stream), llm)
        engine.add_request("a", {"prompt_token_ids": [5, 6, 7]}, GREEDY)
        engine.step()
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError, match="died"):
            while True:  # the step after the kill, or the one after it, finds the worker gone
                engine.step()
        assert time.monotonic() - t0 < 10
    finally:
        engine.shutdown()
    assert children() - before == set()


def test_int8_and_fp8_kv_over_two_ranks_match_one_then_a_worker_that_raises(random_one_kv_head_model,
                                                                             random_stream):
    """``quantization="int8"`` and ``kv_cache_dtype="fp8"`` with TP 2 give TP 1's tokens (same settings): a
    column-parallel shard keeps its rows' scales, a row-parallel shard takes the whole rows' (one all-reduce of
    maxima at load), so each rank holds exactly its part of the unsharded int8 weights; the one KV head is
    replicated on both ranks. Near-ties by TP 1's own top-2 logprobs. Then a worker raises in a step: the engine
    raises with its traceback within seconds, the other worker (waiting in a collective) is stopped too, every
    later step raises at once, and the failed step was rolled back."""
    model = random_one_kv_head_model
    prompts = workload_prompts(random_stream)
    quant = dict(quantization="int8", kv_cache_dtype="fp8", **WORKLOAD)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    ref = LLM(model, **quant).generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    before = children()
    llm = LLM(model, tensor_parallel_size=2, **quant)
    engine = llm.llm_engine
    try:
        got = generate(llm, prompts)
        assert engine.summary().num_preemptions > 0 and any(t.prefix_hit_tokens for t in engine.traces)
        for out, tokens in zip(ref, got):
            want = out.outputs[0].token_ids
            if tokens == want:
                continue
            i = next(j for j, (a, b) in enumerate(zip(tokens, want)) if a != b)
            top2 = sorted((lp.logprob for lp in out.outputs[0].logprobs[i].values()), reverse=True)[:2]
            assert top2[0] - top2[1] < MARGIN, f"token {i} differs from TP 1, top-2 gap {top2[0] - top2[1]:.2e}"

        pids = set(engine.runner.worker_pids)
        engine.add_request("a", {"prompt_token_ids": [5, 6, 7]}, GREEDY)
        engine.step()
        encode = engine.runner._encoder.encode

        def corrupt(sched):  # a block id past the KV pool: the worker's KV write raises
            sched.scheduled[0].block_ids = [10**6]
            return encode(sched)

        engine.runner._encoder.encode = corrupt
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError, match="raised") as err:
            engine.step()
        assert time.monotonic() - t0 < 10
        assert "Traceback" in str(err.value)
        with pytest.raises(WorkerFailedError, match="stopped"):  # and every later step, at once
            engine.step()
        assert not (children() & pids)
        engine.abort_request("a")
        assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks  # the failed step was rolled back
    finally:
        engine.shutdown()
    assert children() - before == set()


def test_bad_tensor_parallel_sizes_are_value_errors_before_any_process(random_tp_model, bundled_model):
    before = children()
    with pytest.raises(ValueError, match="num_attention_heads"):  # 8 heads over 3 ranks
        LLM(random_tp_model, tensor_parallel_size=3, allow_cpu_oversubscription=True)
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=f"tensor_parallel_size \\({cores + 1}\\) exceeds the {cores} CPU cores"):
        EngineConfig(tensor_parallel_size=cores + 1)
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be an integer in \[1, "):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="distributed_executor_backend='uni'"):
        EngineConfig(tensor_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(async_scheduling=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="distributed_executor_backend must be"):
        EngineConfig(distributed_executor_backend="ray")
    with pytest.raises(ValueError, match="logits_processors are not supported with worker processes"):
        EngineConfig(tensor_parallel_size=2, logits_processors=["minengine.v1.sample.logits_processor:X"])
    assert children() == before


def test_structured_outputs_with_worker_processes_is_a_value_error(bundled_tp2_async):
    from minengine.sampling_params import StructuredOutputsParams

    with pytest.raises(ValueError, match="structured_outputs is not supported with worker processes"):
        bundled_tp2_async.generate("ROMEO:", SamplingParams(structured_outputs=StructuredOutputsParams(
            choice=["yes", "no"])), use_tqdm=False)
    assert not bundled_tp2_async.llm_engine.has_unfinished_requests()


def test_tensor_parallel_size_on_every_entry_point(bundled_model, monkeypatch):
    """``LLM(..., tensor_parallel_size=2)`` (above), ``EngineArgs`` and ``minengine serve --tensor-parallel-size 2``."""
    import minengine.__main__ as cli
    from minengine import EngineArgs

    assert EngineArgs(model=bundled_model, tensor_parallel_size=2).create_engine_config().tensor_parallel_size == 2
    configs = []
    monkeypatch.setattr(cli, "cmd_serve", lambda a: configs.append(cli._config(a)))
    cli.main(["serve", "--tensor-parallel-size", "2", "--async-scheduling"])
    assert (configs[0].tensor_parallel_size, configs[0].async_scheduling) == (2, True)
