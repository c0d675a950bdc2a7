"""The runner of a model with two KV cache groups: each step's windowed group batch has the full group's tokens,
positions and row order, and its slot mapping comes from the windowed group's block tables; the windowed layers
read and write through it, the full-attention layers through the full group's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minengine import LLM, SamplingParams
from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from minengine.models import windowed_llama
from minengine.worker.hybrid_model_runner import HybridForwardBatch, HybridModelRunner, windowed_group_output
from tests.conftest import _save_random_model

BS = 4
WINDOW = 6


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory) -> str:
    """A random-weight Qwen2 with one full-attention and one windowed layer."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, tie_word_embeddings=True)
    return _save_random_model(cfg, tmp_path_factory.mktemp("mixed-runner"), seed=9)


def _slots(scheduled: list[ScheduledRequest], tables: dict[str, list[int]], order) -> list[int]:
    """Every new token's slot through ``tables``, in batch order."""
    slots = []
    for i in order:
        s = scheduled[i]
        table = tables[s.request_id]
        slots += [table[p // BS] * BS + p % BS for p in range(s.start_pos, s.seq_len)]
    return slots


def test_each_group_reads_and_writes_through_its_own_tables(mixed_model, monkeypatch):
    llm = LLM(mixed_model, max_model_len=256, block_size=BS, max_num_batched_tokens=8, num_kv_blocks=24,
              enable_prefix_caching=False)
    engine = llm.llm_engine
    runner = engine.runner
    assert isinstance(runner, HybridModelRunner)
    seen = {"steps": 0, "diverged": 0, "windowed_reads": 0}
    prepare = runner.prepare_inputs

    def checked_prepare(out: SchedulerOutput):
        batch = prepare(out)
        assert isinstance(batch, HybridForwardBatch)
        group = batch.windowed_group
        order = batch.batch_order.tolist()
        assert np.array_equal(group.batch_order, batch.batch_order)
        assert torch.equal(group.input_ids, batch.input_ids) and torch.equal(group.positions, batch.positions)
        full_slots = _slots(out.scheduled, {s.request_id: s.block_ids for s in out.scheduled}, order)
        assert batch.slot_mapping.tolist() == full_slots
        assert group.slot_mapping.tolist() == _slots(out.scheduled, out.windowed_block_ids, order)
        seen["steps"] += 1
        seen["diverged"] += group.slot_mapping.tolist() != full_slots
        return batch

    cut = windowed_llama.windowed_batch

    def checked_cut(batch, window):
        assert window == WINDOW and batch is current["batch"].windowed_group  # the windowed group's batch
        seen["windowed_reads"] += 1
        return cut(batch, window)

    current = {}

    def model_call(batch, kv_caches, forward=runner.model.forward):
        current["batch"] = batch
        return forward(batch, kv_caches)

    monkeypatch.setattr(runner, "prepare_inputs", checked_prepare)
    monkeypatch.setattr(windowed_llama, "windowed_batch", checked_cut)
    monkeypatch.setattr(runner.model, "forward", model_call)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(3, 3 + n))} for n in (30, 17, 9)], params, use_tqdm=False)
    assert seen["steps"] > 0 and seen["windowed_reads"] == seen["steps"]
    assert seen["diverged"] > 0  # the windowed pool reused released blocks: its slots are not the full group's


def test_a_step_without_windowed_tables_is_refused_clearly():
    from minengine.sampling_params import SamplingParams as Params

    out = SchedulerOutput(scheduled=[ScheduledRequest("a", [1, 2], 0, [0], True, True, Params(), 0)])
    with pytest.raises(KeyError, match="'a'"):
        windowed_group_output(out)
