"""Lab 3, chunked_prefill: the grader passes the reference budget split, fails the skeleton and every wrong one
with words, and the engine's scheduler really builds its steps with the learner's functions."""

from __future__ import annotations

import pytest

from minengine import EngineConfig, LLMEngine
from minengine.exceptions import VLLMValidationError
from minengine.labs import LabFailure
from minengine.labs.chunked_prefill_lab import SCENARIOS, Harness
from minengine.labs.end_to_end import engine_matches_transformers
from minengine.labs.solutions import chunked_prefill as reference
from tests.labs.lab_checks import (
    assert_reference_passes,
    assert_skeleton_not_implemented,
    assert_wrong_fails,
    assert_wrong_set_is_complete,
    wrong_files,
)

LAB = "chunked_prefill"
WRONG = {
    "chunk_overshoots_budget": ("unit", "prefill_chunk(10, 2, 3, True), the budget below the threshold: expected 2"),
    "ignores_threshold": ("unit", "a prompt over the threshold: expected 3, got 10"),
    "chunks_without_chunked_prefill": ("unit", "no chunked prefill: the prompt does not fit, it waits: expected 0"),
    "blocks_rounded_down": ("unit", "blocks_needed(0, 5, 0, 4), 5 tokens from scratch: expected 2, got 1"),
    "admits_without_free_blocks": ("unit", "10 tokens need 3 blocks, 2 free: it waits: expected 0, got 10"),
    "prefills_before_decodes": ("unit", "('P1', 4), ('P2', 2)], got [('P1', 4), ('P2', 4)]"),
    "runs_preempted_request": ("unit", "whose status is PREEMPTED: it was preempted earlier in this step"),
    "blocks_needed_negative": ("unit", "(never negative): expected 0, got -1"),
    "runs_decodes_twice": ("unit", "fill_step ran request A twice in one step"),
    "exact_fit_waits": ("unit", "no chunked prefill: a prompt of exactly the budget left (it fits whole): expected 10, "
                                "got 0"),
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


def schedule(key: str) -> list:
    scenario, harness, steps = SCENARIOS[key], Harness(reference, **SCENARIOS[key].settings), []
    for index in range(100):
        for args in scenario.arrivals.get(index, []):
            harness.add(*args)
        if not harness.busy and index > max(scenario.arrivals):
            return steps
        steps.append(harness.step())
    raise AssertionError("not finished")


def test_the_reference_schedules_are_the_lesson():
    """The scenarios' steps under the reference, written out: what each unit check holds the learner to."""
    assert schedule("decodes_first")[1] == ([("A", 1), ("B", 1), ("P1", 4), ("P2", 2)], [])
    assert [s for s, _ in schedule("threshold")] == [[("X", 5), ("Y", 5), ("Z", 2)], [("X", 5), ("Y", 2), ("Z", 1)],
                                                    [("Y", 1), ("Z", 1), ("X", 3)], [("X", 1)]]
    assert [s for s, _ in schedule("no_chunking")][:2] == [[("X", 6)], [("X", 1), ("Y", 6), ("Z", 3)]]
    assert [s for s, _ in schedule("free_blocks")][:4] == [[("X", 13)], [("X", 1)], [("X", 1)], [("Y", 9)]]
    assert ([("A", 1), ("B", 1)], ["C"]) in schedule("preemption")


@pytest.mark.parametrize("bug, words", [
    ("chunk_overshoots_budget", "and 1 of the budget left"),  # the lab door's guard: a chunk past the budget
    ("admits_without_free_blocks", "new blocks, but only 5 are free"),
    ("runs_preempted_request", "whose status is PREEMPTED"),
])
def test_end_to_end_stage_alone_catches(bug, words):
    with pytest.raises(LabFailure, match="the engine raised") as failure:
        engine_matches_transformers({LAB: str(wrong_files(LAB)[bug])}, ["chunked_prefill", "preemption"])
    assert words in str(failure.value)


def test_the_engine_schedules_with_the_learners_functions():
    engine = LLMEngine(EngineConfig(labs={LAB: reference.__name__}, max_num_batched_tokens=8,
                                    long_prefill_token_threshold=3, num_kv_blocks=32, max_model_len=64))
    assert type(engine.scheduler.policy).__name__ == "LearnersFill[DecodeFirst]"
    engine.add_request("a", {"prompt_token_ids": list(range(1, 11))})
    engine.add_request("b", {"prompt_token_ids": list(range(20, 27))})
    engine.step()
    assert [(c.request_id, c.num_tokens) for c in engine.traces[-1].chunks] == [("a", 3), ("b", 3)]


def test_a_scheduler_with_another_door_is_refused():
    with pytest.raises(VLLMValidationError, match="chunked_prefill lab .* without"):
        LLMEngine(EngineConfig(labs={LAB: reference.__name__}, speculative_config={"method": "ngram",
                                                                                    "num_speculative_tokens": 2}))
