"""Lab 5, a scheduling policy of the learner's design: graded on SLO attainment against decode-first on the held
trace (modelled clock), not on equality; the mechanics every policy must respect are checked step by step; the
reference (shortest-prompt-first admission) passes and beats the baseline; every wrong policy fails with words."""

from __future__ import annotations

import re

import pytest

from minengine import EngineConfig, LLMEngine
from minengine.core.policies import DecodeFirst
from minengine.labs import LabFailure
from minengine.labs.loading import load_submission
from minengine.labs.scheduling_policy_lab import (
    HELD_SLO,
    attainment,
    check_random_traces,
    check_slo_attainment,
    held_trace,
    replay_with,
)
from minengine.labs.solutions import scheduling_policy as reference
from minengine.workloads.goodput import slo_attainment
from tests.labs.lab_checks import (
    assert_reference_passes,
    assert_skeleton_not_implemented,
    assert_wrong_fails,
    assert_wrong_set_is_complete,
    wrong_files,
)

LAB = "scheduling_policy"
WRONG = {  # bug -> (the stage that catches it first, words of the failure)
    "starves_decodes": ("end_to_end", "is below decode-first's"),
    "never_admits": ("unit", "must admit it; it scheduled []"),
    "overshoots_budget": ("property", "tokens, over max_num_batched_tokens=512"),
    "forgets_prefill_chunks": ("property", "the trace did not finish"),
    "one_at_a_time": ("unit", "must serve both; it scheduled ['r0']"),
    "victim_already_scheduled": ("property", "which is not one of the candidates"),
    "runs_preempted_request": ("property", "called step.run on request q8, whose status is PREEMPTED: it was "
                                           "preempted earlier in this step"),
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


def test_the_held_trace_separates_the_policies():
    """Decode-first misses some SLOs on the held trace (so there is something to win), the reference wins some of
    them back, and the policy that starves decodes loses more: the grade measures the policy."""
    ref, base = attainment(reference)
    worse, same_base = attainment(wrong_files(LAB)["starves_decodes"])
    assert 0.3 < base < 0.9 and worse < base < ref and same_base == base, (worse, base, ref)
    default = slo_attainment(replay_with(None, held_trace(), 100_000).request_metrics, HELD_SLO)
    assert default == base  # the baseline is the engine with no lab: decode-first


def test_property_stage_alone_catches_a_stall():
    """A policy that never admits stalls the random traces too, without the unit checks' help."""
    with pytest.raises(LabFailure, match=re.escape("the trace did not finish")):
        check_random_traces(load_submission(wrong_files(LAB)["never_admits"]))


def test_the_held_trace_alone_catches_no_batching():
    """One request at a time finishes the random traces, but not the held trace in 10x decode-first's steps."""
    with pytest.raises(LabFailure, match=re.escape("the trace did not finish")):
        check_slo_attainment(load_submission(wrong_files(LAB)["one_at_a_time"]))


def test_the_engine_schedules_with_the_learners_policy():
    engine = LLMEngine(EngineConfig(labs={LAB: reference.__name__}, num_kv_blocks=32, max_model_len=128))
    assert isinstance(engine.scheduler.policy, reference.MyPolicy)
    calls = []
    real_fill = engine.scheduler.policy.fill
    engine.scheduler.policy.fill = lambda step: (calls.append(step.step_index), real_fill(step))
    engine.add_request("r", {"prompt_token_ids": [1, 2, 3, 4, 5]})
    while engine.has_unfinished_requests():
        engine.step()
    assert calls and calls == list(range(len(calls)))
    plain = LLMEngine(EngineConfig(num_kv_blocks=32, max_model_len=128))
    assert type(plain.scheduler.policy) is DecodeFirst


def test_the_skeleton_states_the_graded_slo():
    """The learner's file names the SLO the grade is measured against: the grader's own numbers."""
    from minengine.labs import LABS

    text = LABS[LAB].skeleton.read_text()
    stated = f"TTFT <= {HELD_SLO.ttft_s * 1000:g} ms and TPOT <= {HELD_SLO.tpot_s * 1000:g} ms"
    assert stated in text, stated


def test_the_policy_and_chunked_prefill_labs_are_not_run_together():
    """Both write the step's order (a policy's fill): one would silently replace the other, so the pair is refused,
    naming the setting."""
    from minengine.exceptions import VLLMValidationError

    labs = {LAB: reference.__name__, "chunked_prefill": "minengine.labs.solutions.chunked_prefill"}
    with pytest.raises(VLLMValidationError, match="run one of them at a time") as error:
        LLMEngine(EngineConfig(labs=labs, num_kv_blocks=16, max_model_len=64))
    assert error.value.parameter == "labs"


def test_a_fill_that_never_ends_is_stopped_with_words(tmp_path):
    """Admitting "while somebody waits" loops forever once nothing fits: the grader stops it at the step."""
    from pathlib import Path

    from minengine.labs import grade

    source = Path(reference.__file__).read_text()
    endless = source.replace("        step.admit_all()\n",
                             "        while step.waiting:\n            step.admit_next()\n")
    assert endless != source
    path = tmp_path / "endless.py"
    path.write_text(endless)
    report = grade(LAB, path)
    assert report.first_failure.stage == "property", report.format()
    assert "a loop that never ends" in report.first_failure.message, report.format()
