"""Lab 7, speculative decoding's verification: the grader passes the reference, fails the skeleton and every wrong
verification with words, its property and end-to-end stages catch bugs on their own, and the engine verifies and
commits real prompt-lookup proposals through the learner's code."""

from __future__ import annotations

import re

import pytest

from minengine import EngineConfig, LLMEngine
from minengine.labs import LabFailure
from minengine.labs.end_to_end import engine_matches_transformers
from minengine.labs.loading import load_submission
from minengine.labs.spec_verify_lab import (
    SPECULATIVE,
    LabProposer,
    LabSpeculativeCommit,
    LabVerifyingSampler,
    check_propose_like_the_engine,
    check_speculative_runs,
)
from tests.labs.lab_checks import (
    assert_reference_passes,
    assert_skeleton_not_implemented,
    assert_wrong_fails,
    assert_wrong_set_is_complete,
    wrong_files,
)

LAB = "spec_verify"
WRONG = {  # bug -> (the stage that catches it first, words of the failure)
    "one_token_too_many": ("unit", "the first proposal rejected: only the correction"),
    "drops_bonus": ("unit", "every proposal accepted: all of them plus the bonus token"),
    "accepts_after_mismatch": ("unit", "expected [9], got [6, 7, 7]"),
    "rows_off_by_one": ("unit", "request r owns len(proposals[r]) + 1 consecutive rows"),
    "keeps_rejected_blocks": ("unit", "the request holds 3 blocks, its 8 computed tokens need 2"),
    "appends_past_stop": ("unit", "stop at max_tokens=3), got [100, 101, 102, 103, 104]"),
    "computed_off_by_one": ("unit", "num_computed_tokens should be 6 + 2 = 8"),
    "proposer_latest_occurrence": ("unit", "propose, the earliest occurrence of the suffix"),
    "proposer_shortest_first": ("unit", "propose, the longest matching suffix wins"),
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
    ("one_token_too_many", "differs from one-token-at-a-time decoding"),
    ("accepts_after_mismatch", "differs from one-token-at-a-time decoding"),
    ("rows_off_by_one", "differs from one-token-at-a-time decoding"),
    ("keeps_rejected_blocks", "blocks of rejected proposals were not freed"),
    ("computed_off_by_one", "after a sampled step all but the newest token have K/V"),
    ("appends_past_stop", "differs from one-token-at-a-time decoding"),
])
def test_property_stage_alone_catches(bug, words):
    """The real scheduler driven with proposals over a token-free target finds these bugs on its own (a dropped
    bonus token only costs speed, and is caught by the unit check alone)."""
    with pytest.raises(LabFailure, match=re.escape(words)):
        check_speculative_runs(load_submission(wrong_files(LAB)[bug]))


@pytest.mark.parametrize("bug", ["proposer_latest_occurrence", "proposer_shortest_first"])
def test_property_stage_alone_catches_a_wrong_proposer(bug):
    with pytest.raises(LabFailure, match=re.escape("the engine's prompt lookup proposes")):
        check_propose_like_the_engine(load_submission(wrong_files(LAB)[bug]))


@pytest.mark.parametrize("bug", ["one_token_too_many", "rows_off_by_one"])
def test_end_to_end_alone_catches(bug):
    with pytest.raises(LabFailure, match="differs from transformers"):
        engine_matches_transformers({LAB: str(wrong_files(LAB)[bug])}, [SPECULATIVE])


def test_the_engine_verifies_real_proposals_through_the_learners_code():
    """On the end-to-end workload the engine hands the learner's functions proposals, some accepted (runs and
    bonus tokens) and some rejected."""
    module = load_submission("minengine/labs/solutions/spec_verify.py")  # a fresh copy, to count its calls
    real_verify, real_commit, real_propose = module.verify_step, module.commit_verified, module.propose
    seen = {"proposed": 0, "accepted": 0, "commits": 0, "proposals": 0}

    def propose(*args):
        seen["proposals"] += 1
        return real_propose(*args)

    def verify_step(rows, proposals):
        tokens = real_verify(rows, proposals)
        seen["proposed"] += sum(map(len, proposals))
        seen["accepted"] += sum(len(t) - 1 for t in tokens)
        return tokens

    def commit_verified(*args):
        seen["commits"] += 1
        return real_commit(*args)

    module.verify_step, module.commit_verified, module.propose = verify_step, commit_verified, propose
    engine_matches_transformers({LAB: module.__name__}, [SPECULATIVE])
    assert 0 < seen["accepted"] < seen["proposed"] and seen["commits"] > 0 and seen["proposals"] > 0, seen


def test_install_needs_speculative_decoding_and_no_lab_leaves_the_engine():
    with pytest.raises(ValueError, match="speculative_config"):
        LLMEngine(EngineConfig(labs={LAB: "minengine.labs.solutions.spec_verify"}, num_kv_blocks=16, max_model_len=64))
    labbed = LLMEngine(EngineConfig(labs={LAB: "minengine.labs.solutions.spec_verify"}, num_kv_blocks=16,
                                    max_model_len=64, speculative_config=SPECULATIVE.settings["speculative_config"]))
    assert isinstance(labbed.scheduler, LabSpeculativeCommit) and isinstance(labbed.runner.sampler, LabVerifyingSampler)
    assert isinstance(labbed.scheduler.proposer, LabProposer)
    plain = LLMEngine(EngineConfig(num_kv_blocks=16, max_model_len=64,
                                   speculative_config=SPECULATIVE.settings["speculative_config"]))
    assert not isinstance(plain.scheduler, LabSpeculativeCommit)
    assert not isinstance(plain.runner.sampler, LabVerifyingSampler)
