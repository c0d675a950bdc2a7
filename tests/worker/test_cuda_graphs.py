"""The decode CUDA-graph path's bucketing and padding, exercised on the CPU: the same static buffers and padded
rows as a graph replay, run eagerly, with the Triton kernel through its interpreter."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from minengine import LLM, SamplingParams
from minengine.worker.cuda_graphs import DEFAULT_CAPTURE_SIZES, capture_sizes_for, padded_size
from minengine.worker.model_runner import ModelRunner
from tests.conftest import hf_greedy

pytest.importorskip("triton")


def test_capture_sizes_and_padding_bucket():
    assert capture_sizes_for(1) == [1]
    assert capture_sizes_for(5) == [1, 2, 4, 5]
    assert capture_sizes_for(64) == [s for s in DEFAULT_CAPTURE_SIZES if s <= 64]
    assert capture_sizes_for(1000)[-1] == 1000 and 512 in capture_sizes_for(1000)
    sizes = capture_sizes_for(24)
    for n in range(1, 25):
        p = padded_size(n, sizes)
        assert p >= n and p in sizes and all(s < n for s in sizes if s < p)  # the smallest that fits
    assert padded_size(25, sizes) is None
    with pytest.raises(ValueError, match="max_batch"):
        capture_sizes_for(0)


def graph_engine(model: str, max_num_seqs: int) -> LLM:
    llm = LLM(model, max_model_len=256, max_num_seqs=max_num_seqs, max_num_batched_tokens=64)
    e = llm.llm_engine
    e.runner = ModelRunner(e.model, e.num_kv_blocks, e.config.block_size, seed=e.config.seed,
                           attention_backend="triton", cuda_graphs=True, max_num_seqs=max_num_seqs)
    return llm


def test_padded_decode_path_matches_transformers(random_llama):
    """5 requests with different lengths: the decode batch shrinks 5 -> 1, so it is padded to 8, then run at 4,
    2, 1 (rows left over from a larger step must be reset, or they would write K/V into live blocks)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (9, 3, 17, 6, 12)]
    max_new = [6, 2, 4, 3, 5]
    llm = graph_engine(random_llama, max_num_seqs=8)
    graphs = llm.llm_engine.runner.graphs
    assert graphs.sizes == [1, 2, 4, 8] and not graphs.capture
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_new],
                        use_tqdm=False)
    for p, n, o in zip(prompts, max_new, outs):
        assert o.outputs[0].token_ids == hf_greedy(random_llama, tuple(p), n)
    assert graphs.num_replays >= 4 and graphs.num_eager_fallbacks >= 1  # decode steps replayed, prefills eager
    assert llm.llm_engine.kv_cache_manager.num_free_blocks == llm.llm_engine.num_kv_blocks


def test_load_resets_rows_past_the_batch(random_llama):
    llm = graph_engine(random_llama, max_num_seqs=8)
    runner = llm.llm_engine.runner
    graphs = runner.graphs
    pad_slot = graphs.pad_block * graphs.block_size
    assert graphs.pad_block == llm.llm_engine.num_kv_blocks  # the extra block no request gets
    graphs.slot_mapping[:8] = 7  # as left by a step of 8 real decodes
    graphs.seq_lens[:8] = 30
    from tests.worker.test_attention_paths import make_step

    step, *_ = make_step([(5, 1), (9, 1), (2, 1)], 2, 16, seed=0)
    batch = runner.prepare_inputs(step)
    assert graphs.supports(batch)
    graphs.load(batch, 4)
    assert graphs.slot_mapping[:3].tolist() == batch.slot_mapping.tolist()
    assert graphs.slot_mapping[3].item() == pad_slot and graphs.seq_lens[3].item() == 1
    assert graphs.block_tables[3, 0].item() == graphs.pad_block
    prefill, *_ = make_step([(0, 5), (9, 1)], 2, 16, seed=0)
    assert not graphs.supports(runner.prepare_inputs(prefill))  # a prefill chunk: eager


def test_cuda_graphs_need_the_triton_backend(random_llama):
    e = LLM(random_llama, max_model_len=64).llm_engine
    with pytest.raises(ValueError, match="triton"):
        ModelRunner(e.model, 8, 16, attention_backend="reference", cuda_graphs=True)
    with pytest.raises(ValueError, match="attention_backend"):
        ModelRunner(e.model, 8, 16, attention_backend="flash")
    assert ModelRunner(e.model, 8, 16).graphs is None  # CPU default: a CPU backend, no graphs
