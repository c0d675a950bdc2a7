"""Lab 1, block_pool: the grader passes the reference pool, fails the skeleton and every wrong pool with words, and
the engine really runs on the learner's pool (and on nothing else when no lab is set)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minengine import EngineConfig, LLMEngine
from minengine.exceptions import VLLMValidationError
from minengine.labs import LabFailure
from minengine.labs.block_pool_lab import check_random_workloads
from minengine.labs.end_to_end import engine_matches_transformers
from minengine.labs.loading import load_submission
from minengine.labs.solutions import block_pool as reference
from tests.labs.lab_checks import (
    assert_reference_passes,
    assert_skeleton_not_implemented,
    assert_wrong_fails,
    assert_wrong_set_is_complete,
    wrong_files,
)

LAB = "block_pool"
# bug -> (the stage that catches it, words of the failure)
WRONG = {
    "refcount_never_drops": ("unit", "ref_cnt of a block held twice, freed once: expected 1, got 2"),
    "lifo_reuse": ("unit", "head of the free queue first): expected [0, 1], got [4, 3]"),
    "eviction_keeps_hash": ("unit", "block_hash of a cached block handed out again (evicted): expected None"),
    "touch_keeps_block_in_free_queue": ("unit", "is_free of a free cached block after touch (in use again)"),
    "last_block_refused": ("unit", "cannot allocate 3 blocks: only 3 free"),
    "double_free_allowed": ("unit", "free_blocks of a block whose ref count is already 0 must raise RuntimeError"),
    "second_copy_wins": ("unit", "(the first copy stays): expected 0, got 1"),
    "reset_keeps_block_hashes": ("unit", "block_hash of blocks 0 and 1 after reset_prefix_cache"),
    "touch_only_cached": ("unit", "is_free of a free block WITHOUT a hash after touch (any block at ref count 0 "
                                  "leaves the free queue when touched, cached or not): expected False, got True"),
    "free_count_skips_cached": ("unit", "num_free_blocks with one free block, which keeps its hash (a cached free "
                                        "block is free: get_new_blocks may hand it out): expected 1, got 0"),
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


@pytest.mark.parametrize("bug", ["eviction_keeps_hash", "touch_keeps_block_in_free_queue", "refcount_never_drops",
                                 "lifo_reuse"])
def test_property_stage_alone_catches(bug):
    """The random workloads catch these bugs without the unit checks' help (hypothesis finds a sequence)."""
    module = load_submission(wrong_files(LAB)[bug])
    with pytest.raises(LabFailure, match="pool of .* blocks, after"):
        check_random_workloads(module)
    check_random_workloads(reference)  # and the reference passes the same check


def test_end_to_end_catches_a_pool_that_serves_evicted_blocks():
    """The engine on a pool that keeps evicted hashes gives other tokens than transformers (or breaks): the end-to-end
    stage alone sees the bug."""
    module = wrong_files(LAB)["eviction_keeps_hash"]
    with pytest.raises(LabFailure, match="workload 'evictions'"):
        engine_matches_transformers({LAB: str(module)}, ["evictions"])


def test_the_engine_runs_on_the_learners_pool():
    engine = LLMEngine(EngineConfig(labs={LAB: reference.__name__}, num_kv_blocks=32, max_model_len=128))
    assert type(engine.kv_cache_manager.pool) is reference.BlockPool
    assert type(engine).__name__ == "LabLLMEngine" and isinstance(engine, LLMEngine)
    assert [(p.lab, p.source) for p in engine.lab_parts] == [(LAB, reference.__name__)]
    engine.add_request("r", {"prompt_token_ids": [1, 2, 3, 4, 5]})
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_cache_manager.pool.num_free_blocks == 32


def test_no_lab_is_the_default_engine():
    from minengine.core.block_pool import BlockPool

    for labs in (None, {}):
        engine = LLMEngine(EngineConfig(labs=labs, num_kv_blocks=8, max_model_len=64))
        assert type(engine) is LLMEngine and type(engine.kv_cache_manager.pool) is BlockPool
        assert not hasattr(engine, "lab_parts")


@given(st.one_of(st.text(max_size=5), st.integers(), st.lists(st.text(max_size=3), max_size=2),
                 st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.just("")), min_size=1,
                                 max_size=2)))
def test_bad_labs_are_refused_naming_the_field(labs):
    """Anything but {known lab: non-empty string} is refused before a weight is loaded, naming ``labs``."""
    from minengine.labs.door import check_labs

    with pytest.raises(VLLMValidationError) as error:
        check_labs(labs)
    assert error.value.parameter == "labs" and "labs" in str(error.value)


def test_a_missing_or_broken_file_is_refused_naming_the_lab(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("class BlockPool:\n    def __init__(self, n)\n        pass\n")
    with pytest.raises(VLLMValidationError, match=r"labs\['block_pool'\]: .*broken.py.*SyntaxError.*line|"
                                                  r"labs\['block_pool'\]: .*SyntaxError.*broken.py:2"):
        LLMEngine(EngineConfig(labs={LAB: str(broken)}))
    with pytest.raises(VLLMValidationError, match=r"labs\['block_pool'\]: .*does not exist"):
        LLMEngine(EngineConfig(labs={LAB: str(tmp_path / "nowhere.py")}))
