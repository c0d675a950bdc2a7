"""Lab 2, prefix_cache: the grader passes the reference hash chain and lookup, fails the skeleton and every wrong
one with words, and the engine's prefix cache really runs on the learner's functions."""

from __future__ import annotations

import pytest

from minengine import EngineConfig, LLMEngine
from minengine.labs import LabFailure
from minengine.labs.end_to_end import engine_matches_transformers
from minengine.labs.solutions import prefix_cache as reference
from tests.labs.lab_checks import (
    assert_reference_passes,
    assert_skeleton_not_implemented,
    assert_wrong_fails,
    assert_wrong_set_is_complete,
    wrong_files,
)

LAB = "prefix_cache"
WRONG = {
    "no_recompute_last_token": ("unit", "12 tokens = exactly 3 full blocks, all cached"),
    "one_block_short": ("unit", "expected ['block of h0', 'block of h1'], got ['block of h0']"),
    "unchained_hash": ("unit", "is the same under two different parents"),
    "skips_missing_block": ("unit", "the prefix ends at the first miss"),
    "hashes_partial_block": ("unit", "the partial third gets no hash): expected 2, got 3"),
    "rehashes_from_scratch": ("unit", "twice with the same 6 tokens, block_size=4 (nothing new to hash): expected 1"),
    "sum_hash": ("unit", "[1, 2, 3, 4] vs [4, 3, 2, 1] (order matters) give the same hash"),
    "digits_concat": ("unit", "[1, 23] vs [12, 3] (the same digits run together: keep the ids apart) give the same"),
    "uint16_tokens": ("unit", "[70000, 1] vs [4464, 1] (70000 - 65536 = 4464: an id needs more than 16 bits"),
    "py_hash": ("unit", "give other bytes in another Python process (PYTHONHASHSEED="),
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


@pytest.mark.parametrize("bug, words", [
    ("no_recompute_last_token", "no request could be scheduled"),  # a repeated prompt of whole blocks: nothing left
    ("unchained_hash", "output token 2 differs from transformers"),  # blocks hit at other positions: other K/V
])
def test_end_to_end_stage_alone_catches(bug, words):
    """Without the unit checks, the engine on these parts fails the comparison with transformers, in words."""
    with pytest.raises(LabFailure, match="workload 'prefix_hits'") as failure:
        engine_matches_transformers({LAB: str(wrong_files(LAB)[bug])}, ["prefix_hits"])
    assert words in str(failure.value)


def test_the_engine_hashes_and_looks_up_with_the_learners_functions():
    engine = LLMEngine(EngineConfig(labs={LAB: reference.__name__}, block_size=4, num_kv_blocks=32, max_model_len=64))
    kv = engine.kv_cache_manager
    assert type(kv).__name__.startswith("LearnersPrefixCache[")
    prompt = list(range(1, 11))
    for request_id in ("a", "b"):
        engine.add_request(request_id, {"prompt_token_ids": prompt})
        while engine.has_unfinished_requests():
            engine.step()
    expected: list[bytes] = []
    reference.extend_block_hashes(expected, prompt, 4)
    assert kv.pool.get_cached_block(expected[1]) is not None  # indexed under the learner's hashes
    assert engine.summary().prefix_hit_tokens == 8  # b hit both full blocks of a's prompt
