"""Lab 6, paged attention's read: the grader passes the reference, fails the skeleton and every wrong read with
words, its property and end-to-end stages catch bugs on their own, and every attention layer of the engine reads
through the learner's function."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from minengine import EngineConfig, LLMEngine
from minengine.labs import LabFailure, grade
from minengine.labs.end_to_end import engine_matches_transformers
from minengine.labs.loading import load_submission
from minengine.labs.paged_attention_lab import (
    LabAttention,
    _random_step,
    _step_reference,
    check_paged_attention,
    check_random_steps,
)
from minengine.labs.solutions import paged_attention as reference
from minengine.layers.reference_attention import paged_attention_reference
from minengine.models.llama import Attention
from minengine.worker.forward_batch import ForwardBatch
from tests.labs.lab_checks import (
    assert_reference_passes,
    assert_skeleton_not_implemented,
    assert_wrong_fails,
    assert_wrong_set_is_complete,
    wrong_files,
)

LAB = "paged_attention"
WRONG = {  # bug -> (the stage that catches it first, words of the failure)
    "last_block_floor": ("unit", "returned shape (8, 2, 3), expected (10, 2, 3)"),
    "whole_last_block": ("unit", "returned shape (12, 2, 3), expected (10, 2, 3)"),
    "sees_one_future_token": ("unit", "attend, a prefill from position 0: the causal mask"),
    "mask_from_chunk_start": ("unit", "attend, a decode: one query at the last position sees every key"),
    "gqa_modulo": ("unit", "attend, grouped-query attention: query head h reads KV head h // (Hq // Hkv)"),
    "missing_scale": ("unit", "scores scaled by 1/sqrt(D)"),
    "sorted_block_ids": ("unit", "position 0 must come from block 5 slot 0"),
    "reads_padding_block": ("unit", "gather_kv (exactly full blocks, then padding: block_size 4, block table [3, 6, 8, "
                                    "8], seq_len 8): it read a padding entry of a block table"),
    "ignores_scale": ("unit", "attend, the scale given, 0.6, not 1/sqrt(D) = 0.25"),
    "softmax_without_max": ("unit", "attend with large scores (scale * q.k up to 318; q_len 3, seq_len 7, Hq 2, "
                                    "Hkv 2): the output holds NaN or inf: exp(score) overflowed float32"),
    "returns_float32": ("unit", "attend in bfloat16 (q_len 2, seq_len 6, Hq 4, Hkv 2): returned torch.float32, "
                                "expected torch.bfloat16 (query's dtype)"),
}
UNIT_ONLY = {  # bugs the property stage cannot see, and why
    "returns_float32": "its paged_attention writes attend's rows into a tensor like query, which casts them back",
}


def test_reference_passes():
    assert_reference_passes(LAB)


def test_skeleton_fails_with_not_implemented():
    assert_skeleton_not_implemented(LAB)


def test_wrong_implementations_are_listed():
    assert_wrong_set_is_complete(LAB, WRONG)


@pytest.mark.parametrize("bug", sorted(WRONG))
def test_wrong_implementation_fails(bug):
    assert_wrong_fails(LAB, bug, *WRONG[bug])


@pytest.mark.parametrize("bug", sorted(set(WRONG) - set(UNIT_ONLY)))
def test_property_stage_alone_catches(bug):
    """Random steps (any block size, heads, context, shuffled blocks, sharp heads) catch every wrong read on their
    own, but for the wrong dtype of attend alone (``UNIT_ONLY``)."""
    words = "it read a padding entry" if bug == "reads_padding_block" else "differs from the definition"
    with pytest.raises(LabFailure, match=re.escape(words)):
        check_random_steps(load_submission(wrong_files(LAB)[bug]))


@pytest.mark.parametrize("bug, words", [("gqa_modulo", "differs from transformers"),
                                       ("sees_one_future_token", "differs from transformers"),
                                       ("reads_padding_block", "the engine raised IndexError")])
def test_end_to_end_alone_catches(bug, words):
    """The engine reading through a wrong read gives other tokens than transformers, or (padding past a request's
    blocks is an id past the pool) fails at the learner's line."""
    with pytest.raises(LabFailure, match=words) as failure:
        engine_matches_transformers({LAB: str(wrong_files(LAB)[bug])}, ["chunked_prefill"])
    if bug == "reads_padding_block":
        assert "reads_padding_block.py:15 in gather_kv" in str(failure.value)


def test_the_checks_reference_is_the_engines_reference_attention():
    """The dense definition the checks grade against agrees with the engine's own reference backend on a step
    built by ``ForwardBatch`` (so the lab teaches the read the engine does)."""
    from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput
    from minengine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(0)
    block_size, hkv, hq, d = 4, 2, 4, 8
    k_cache, v_cache = torch.randn(12, block_size, hkv, d, generator=gen), torch.randn(12, block_size, hkv, d,
                                                                                       generator=gen)
    params = SamplingParams()
    steps = [("a", 6, 3, [7, 2, 9]), ("b", 0, 5, [4, 1]), ("c", 9, 1, [0, 11, 3])]  # (id, context, new, blocks)
    out = SchedulerOutput(scheduled=[
        ScheduledRequest(request_id=rid, token_ids=[1] * new, start_pos=ctx, block_ids=blocks, sample=True,
                         is_prefill=new > 1, sampling_params=params, output_index=0, prompt_token_ids=[1],
                         output_token_ids=[])
        for rid, ctx, new, blocks in steps])
    batch = ForwardBatch.build(out, block_size, attention_backend="reference")
    query = torch.randn(batch.num_tokens, hq, d, generator=gen)
    key = k_cache.view(-1, hkv, d)[batch.slot_mapping]
    value = v_cache.view(-1, hkv, d)[batch.slot_mapping]
    engine_out = paged_attention_reference(query, key, value, k_cache, v_cache, batch, d ** -0.5)
    tables = torch.tensor([out.scheduled[i].block_ids + [0] * (3 - len(out.scheduled[i].block_ids))
                           for i in batch.batch_order.tolist()], dtype=torch.int32)
    dense = _step_reference(query, k_cache, v_cache, tables, batch.seq_lens, batch.query_start_loc, d ** -0.5)
    mine = reference.paged_attention(query, k_cache, v_cache, tables, batch.seq_lens, batch.query_start_loc, d ** -0.5)
    torch.testing.assert_close(engine_out.double(), dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine.double(), dense, atol=1e-5, rtol=1e-5)


def test_every_layer_reads_through_the_learners_function():
    module = load_submission("minengine/labs/solutions/paged_attention.py")  # a fresh copy, to count its calls
    real, calls = module.paged_attention, []

    def counted(query, *args):
        calls.append(query.shape[0])
        return real(query, *args)

    module.paged_attention = counted
    engine = LLMEngine(EngineConfig(labs={LAB: module.__name__}, num_kv_blocks=32, max_model_len=128))
    layers = engine.runner.model.model.layers
    assert all(isinstance(layer.self_attn, LabAttention) for layer in layers)
    engine.add_request("r", {"prompt_token_ids": list(range(1, 20))})
    num_steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        num_steps += 1
    assert len(calls) == num_steps * len(layers) and calls[0] == 19  # the prefill, then one row per decode
    plain = LLMEngine(EngineConfig(num_kv_blocks=32, max_model_len=128))
    assert all(type(layer.self_attn) is Attention for layer in plain.runner.model.model.layers)


def test_random_step_shapes():
    """The property check's steps hold what they claim: tables with padding past each request's blocks."""
    query, k_cache, _, tables, seq_lens, qsl = _random_step(3, 3, 4, 2, 2)
    assert query.shape[0] == int(qsl[-1]) and tables.shape[0] == 3 and len(seq_lens) == 3
    assert all(int(seq_lens[b]) >= int(qsl[b + 1] - qsl[b]) for b in range(3))


def test_a_shape_error_names_the_inputs_of_the_failing_case(tmp_path):
    """A RuntimeError out of the learner's tensor code (here: no repeat of the KV heads for grouped-query heads) is
    reported with the case and the shapes and dtypes of its inputs, at the learner's line."""
    source = Path(reference.__file__).read_text()
    no_repeat = source.replace("    k = keys.repeat_interleave(group, dim=1)", "    k = keys")
    assert no_repeat != source
    path = tmp_path / "no_repeat.py"
    path.write_text(no_repeat)
    report = grade(LAB, path)
    message = report.first_failure.message
    assert message.startswith("attend, grouped-query attention: query head h reads KV head h // (Hq // Hkv) (q_len 2, "
                              "seq_len 6, Hq 8, Hkv 2): raised RuntimeError: "), message
    assert f"{path}:" in message and "in attend" in message, message
    assert ("the inputs of this case: query [2, 8, 16] float32, keys [6, 2, 16] float32, values [6, 2, 16] float32, "
            "scale 0.25") in message, message


def test_a_request_s_rows_are_named_inclusive_and_as_a_slice():
    """The rows of a request in a failure read one way: "rows 5 to 8 inclusive, query[5:9]"."""
    with pytest.raises(LabFailure, match=r"\(rows (\d+) to (\d+) inclusive, query\[\1:(\d+)\]") as failure:
        check_paged_attention(load_submission(wrong_files(LAB)["sees_one_future_token"]))
    first, last, stop = map(int, re.search(r"rows (\d+) to (\d+) inclusive, query\[\d+:(\d+)\]",
                                           str(failure.value)).groups())
    assert stop == last + 1 and first <= last
