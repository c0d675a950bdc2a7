"""Tensor parallelism on the CPU: N worker processes over torch.distributed (gloo), one scheduler.

Greedy tokens equal TP=1 (the in-process engine) and transformers, on the bundled model (TP 2; tied LM head,
KV heads 2 -> 1 per rank) and on a random Llama with 8 query / 4 KV heads and a vocabulary that does not divide
by the ranks (TP 2 and TP 4, untied LM head), with chunked prefill, prefix-cache hits and preemptions in the
same run. A float32 all-reduce adds in another order than one matmul: a token may differ only where the
top-2 logits of transformers are closer than ``MARGIN`` (checked, never skipped). Also: the all-reduces a step
runs equal what ``StepCostModel`` charges for it; a worker that raises or dies makes the engine raise within
seconds; shutdown leaves no process; bad sizes are ValueErrors before any process starts.

The machine has 2 cores: TP 2 runs 2 gloo processes; TP 4 runs 4 on the 2 cores with
``allow_cpu_oversubscription=True`` (refused without it, tested below). Workers are spawned: they get this
process's ``sys.path`` (the checkout's minengine; a worker that imports another copy refuses to start).
"""

from __future__ import annotations

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
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=509, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    return _save_random_model(cfg, tmp_path_factory.mktemp("llama_8_4"), seed=3)


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


def check_against_tp1_and_hf(model: str, prompts: list[list[int]], llm: LLM, **config) -> None:
    engine = llm.llm_engine
    got = generate(llm, prompts)
    tp1 = generate(LLM(model, **WORKLOAD, **config), prompts)
    for prompt, g, t in zip(prompts, got, tp1):
        assert_same_greedy(model, prompt, g, t, "vs TP=1")
        assert_same_greedy(model, prompt, g, hf_greedy(model, tuple(prompt), MAX_NEW), "vs transformers")
    summary = engine.summary()
    assert summary.num_preemptions > 0
    assert any(t.prefix_hit_tokens for t in engine.traces)
    assert any(t.num_prefill_tokens and t.num_decode_tokens for t in engine.traces)  # a chunk beside decodes
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def expected_all_reduces(cost_model: StepCostModel, work: StepWork, element_size: int) -> tuple[int, int]:
    """(all-reduces, bytes reduced) that ``cost_model`` charges for a step, through its public API: on a
    hardware where one all-reduce costs 1 s of latency and bandwidth is unlimited, ``communication_time_s`` is
    the count; ``communication_bytes`` is ``2 (tp - 1) / tp`` (ring) x the bytes of the reduced tensors, which it
    prices in 16-bit activations (its docstring), converted here to the engine's ``element_size``."""
    cost = cost_model.cost(work)
    count = round(cost.communication_time_s)
    assert abs(cost.communication_time_s - count) < 1e-6
    tp = cost_model.tp
    elements = cost.communication_bytes / (2 * (tp - 1) / tp) / 2
    return count, round(elements) * element_size


@pytest.fixture(scope="module")
def bundled_tp2(bundled_model):
    llm = LLM(bundled_model, tensor_parallel_size=2, **WORKLOAD)
    yield llm
    llm.llm_engine.shutdown()


def test_bundled_model_tp2_matches_tp1_and_transformers(bundled_model, bundled_stream, bundled_tp2):
    assert len(bundled_tp2.llm_engine.runner.worker_pids) == 2 and bundled_tp2.llm_engine.model is None
    check_against_tp1_and_hf(bundled_model, workload_prompts(bundled_stream), bundled_tp2)


def test_all_reduces_per_step_equal_the_cost_model(bundled_model, bundled_tp2):
    """Counted in every worker (``TensorParallelGroup``): 2 per layer over [tokens, hidden], 1 over the sampled
    rows' logits [rows, vocab]; a step with no sampling row runs no LM head."""
    engine = bundled_tp2.llm_engine
    cost_model = StepCostModel(H100_SXM.with_(allreduce_latency_s=1.0, interconnect_bandwidth=1e30,
                                              comm_efficiency=1.0), bundled_model, tp=2)
    engine.add_request("long", {"prompt_token_ids": list(range(3, 150))}, SamplingParams(max_tokens=3))
    engine.add_request("short", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4))
    seen = set()
    while engine.has_unfinished_requests():
        engine.step()
        trace = engine.traces[-1]
        count, nbytes = expected_all_reduces(cost_model, StepWork.from_step_trace(trace), 4)
        for reply in engine.runner.last_replies:
            assert (reply.num_all_reduces, reply.all_reduce_bytes) == (count, nbytes), f"step {trace.step}"
        seen.add(any(c.sampled for c in trace.chunks))
    assert seen == {True, False}  # steps with and without the LM head


@pytest.mark.parametrize("model, tp", [("random_tp_model", 2), ("random_tp_model", 4), ("bundled_model", 4)])
def test_more_ranks_match_tp1_and_transformers(request, model, tp):
    """8 query / 4 KV heads over 2 and 4 ranks (vocabulary 509: uneven LM-head slices); the bundled model's 2 KV
    heads over 4 ranks: each KV head replicated on 2 ranks. TP 4 runs 4 processes on this machine's 2 cores."""
    path = request.getfixturevalue(model)
    prompts = workload_prompts(request.getfixturevalue("random_stream" if model == "random_tp_model"
                                                       else "bundled_stream"))
    llm = LLM(path, tensor_parallel_size=tp, allow_cpu_oversubscription=tp > 2, **WORKLOAD)
    try:
        assert len(llm.llm_engine.runner.worker_pids) == tp
        check_against_tp1_and_hf(path, prompts, llm)
    finally:
        llm.llm_engine.shutdown()


def test_async_scheduling_tp2_gives_the_same_tokens(bundled_model, bundled_stream):
    """Async scheduling over two ranks: the placeholders are filled by every rank from its own sampled tokens."""
    prompts = workload_prompts(bundled_stream)
    llm = LLM(bundled_model, tensor_parallel_size=2, async_scheduling=True, **WORKLOAD)
    try:
        check_against_tp1_and_hf(bundled_model, prompts, llm)
    finally:
        llm.llm_engine.shutdown()


def test_a_worker_that_raises_stops_the_engine_with_its_traceback(random_tp_model):
    before = children()
    llm = LLM(random_tp_model, tensor_parallel_size=2, max_model_len=256)
    engine = llm.llm_engine
    pids = set(engine.runner.worker_pids)
    assert pids <= children() - before
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
    assert not (children() & pids)  # the other worker, waiting in a collective, is stopped too
    engine.abort_request("a")
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks  # the failed step was rolled back


def test_a_worker_that_dies_stops_the_engine_and_shutdown_leaves_no_process(random_tp_model):
    before = children()
    llm = LLM(random_tp_model, tensor_parallel_size=2, max_model_len=256)
    engine = llm.llm_engine
    pids = engine.runner.worker_pids
    engine.add_request("a", {"prompt_token_ids": [5, 6, 7]}, GREEDY)
    engine.step()
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError, match="died"):
        while True:  # the step after the kill, or the one after it, finds the worker gone
            engine.step()
    assert time.monotonic() - t0 < 10
    engine.shutdown()
    assert children() - before == set()

    llm = LLM(random_tp_model, tensor_parallel_size=2, max_model_len=256)  # a clean shutdown, by garbage collection
    assert len(children() - before) == 2
    generate(llm, [[5, 6, 7]])
    del llm
    import gc

    gc.collect()
    assert children() - before == set()


def test_bad_tensor_parallel_sizes_are_value_errors_before_any_process(random_tp_model, bundled_model):
    before = children()
    with pytest.raises(ValueError, match="num_attention_heads"):  # 8 heads over 3 ranks
        LLM(random_tp_model, tensor_parallel_size=3, allow_cpu_oversubscription=True)
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=f"tensor_parallel_size \\({cores + 1}\\) exceeds the {cores} CPU cores"):
        EngineConfig(tensor_parallel_size=cores + 1)
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="distributed_executor_backend='uni'"):
        EngineConfig(tensor_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(async_scheduling=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="distributed_executor_backend must be"):
        EngineConfig(distributed_executor_backend="ray")
    assert children() == before


def test_tensor_parallel_size_on_every_entry_point(bundled_model, monkeypatch):
    """``LLM(..., tensor_parallel_size=2)`` (above), ``EngineArgs`` and ``minengine serve --tensor-parallel-size 2``."""
    import minengine.__main__ as cli
    from minengine import EngineArgs

    assert EngineArgs(model=bundled_model, tensor_parallel_size=2).create_engine_config().tensor_parallel_size == 2
    configs = []
    monkeypatch.setattr(cli, "cmd_serve", lambda a: configs.append(cli._config(a)))
    cli.main(["serve", "--tensor-parallel-size", "2", "--async-scheduling"])
    assert (configs[0].tensor_parallel_size, configs[0].async_scheduling) == (2, True)


def test_int8_weights_and_fp8_kv_over_two_ranks_match_one(random_tp_model, random_stream):
    """``quantization="int8"`` and ``kv_cache_dtype="fp8"`` with TP 2 give TP 1's tokens: a column-parallel shard
    keeps its rows' scales, a row-parallel shard takes the whole rows' (one all-reduce of maxima at load), so
    each rank holds exactly its part of the unsharded int8 weights. Near-ties by TP 1's own top-2 logprobs."""
    prompts = workload_prompts(random_stream)
    quant = dict(quantization="int8", kv_cache_dtype="fp8", **WORKLOAD)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    ref = LLM(random_tp_model, **quant).generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm = LLM(random_tp_model, tensor_parallel_size=2, **quant)
    try:
        got = generate(llm, prompts)
    finally:
        llm.llm_engine.shutdown()
    for out, tokens in zip(ref, got):
        want = out.outputs[0].token_ids
        if tokens == want:
            continue
        i = next(j for j, (a, b) in enumerate(zip(tokens, want)) if a != b)
        top2 = sorted((lp.logprob for lp in out.outputs[0].logprobs[i].values()), reverse=True)[:2]
        assert top2[0] - top2[1] < MARGIN, f"token {i} differs from TP 1 with a top-2 gap of {top2[0] - top2[1]:.2e}"
