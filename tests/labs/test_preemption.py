"""Lab 4, preemption: the grader passes the reference, fails the skeleton and every wrong preemption with words, its
property and end-to-end stages catch bugs on their own, and the engine really preempts through the learner's code."""

from __future__ import annotations

import re

import pytest

from minengine import EngineConfig, LLMEngine
from minengine.core.step_builder import StepBuilder
from minengine.labs import LabFailure, grade
from minengine.labs.end_to_end import WORKLOADS, engine_matches_transformers, run_workload
from minengine.labs.loading import load_submission
from minengine.labs.preemption_lab import LabPreemption, check_random_workloads
from minengine.request import Request
from minengine.sampling_params import SamplingParams
from tests.labs.lab_checks import (
    assert_reference_passes,
    assert_skeleton_not_implemented,
    assert_wrong_fails,
    assert_wrong_set_is_complete,
    wrong_files,
)

LAB = "preemption"
WRONG = {  # bug -> (the stage that catches it first, words of the failure)
    "not_requeued": ("unit", "r1 must be the FIRST waiting request (it goes next); waiting is []"),
    "computed_not_reset": ("unit", "num_computed_tokens must be 0 (its K/V is gone), got 6"),
    "victim_already_scheduled": ("unit", "got r2 (a request scheduled in this step is never a victim)"),
    "newest_not_policy": ("unit", "the victim must be r0 (ask step.policy.pick_victim), got r2"),
    "leaks_blocks": ("unit", "all 2 of r1's blocks must be free: it still holds 1"),
    "requeued_at_back": ("property", "the engine's preemption scheduled"),
    "request_not_stopped": ("unit", "r0 is its own victim: it must be preempted (waiting again) and the call "
                                    "return False; got True"),
    "preempt_once": ("unit", "both must be preempted (r2, then r1: keep preempting while the slots do not fit)"),
    "drops_output_tokens": ("unit", "r1's generated tokens must stay: they were [7], now []. Preemption by recompute "
                                    "drops K/V, not tokens"),
    "records_request": ("unit", "step.out.preempted_ids must be ['r1'], got [a Request object (r1), not its id]"),
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
    ("not_requeued", "is in neither running nor waiting"),
    ("leaks_blocks", "the waiting (preempted) request"),
    ("computed_not_reset", "computed tokens: preemption by recompute frees all its blocks and resets its progress"),
    ("victim_already_scheduled", "the engine's preemption scheduled"),
    ("newest_not_policy", "the engine asked the policy 'oldest-victim' (each workload runs under a policy the grader "
                          "draws: your pick_victim must ask step.policy, whichever it is) for a victim among the "
                          "candidates, the running requests not yet scheduled in this step in admission order: among "
                          "r2, r0 it picks r2. Its rule: the oldest candidate"),
    ("records_request", "preempted [a Request object (r1), not its id]"),
    ("drops_output_tokens", "the engine's preemption scheduled"),
])
def test_property_stage_alone_catches(bug, words):
    """Random workloads against the engine's own scheduler find these bugs without the unit checks."""
    with pytest.raises(LabFailure, match=re.escape(words)):
        check_random_workloads(load_submission(wrong_files(LAB)[bug]))


def test_a_message_never_prints_a_whole_request():
    """A Request where its id belongs is named in a few words, whichever stage finds it (its repr is ~1,500
    characters)."""
    from minengine.labs.preemption_lab import shown

    report = grade(LAB, wrong_files(LAB)["records_request"])
    assert "Request(" not in report.first_failure.message and len(report.first_failure.message) < 300
    with pytest.raises(LabFailure) as failure:
        check_random_workloads(load_submission(wrong_files(LAB)["records_request"]))
    assert "Request(" not in str(failure.value) and "Why the engine's victims" not in str(failure.value)
    request = Request("r9", [1, 2], SamplingParams(), 0.0)
    assert len(repr(request)) > 300 and shown([request, "r1", (request,)]) == (
        "[a Request object (r9), not its id, 'r1', [a Request object (r9), not its id]]")


def test_end_to_end_alone_catches_a_lost_request():
    """On the real engine a victim that is never re-queued never finishes: the end-to-end stage sees it too."""
    with pytest.raises(LabFailure, match="workload 'preemption'"):
        engine_matches_transformers({LAB: str(wrong_files(LAB)["not_requeued"])}, ["preemption"])


def test_the_engine_preempts_through_the_learners_code():
    module = load_submission("minengine/labs/solutions/preemption.py")  # a fresh copy, to count its calls
    calls = {"preempt": 0, "allocate_or_preempt": 0}

    def counting(name):
        real = getattr(module, name)

        def counted(*args):
            calls[name] += 1
            return real(*args)
        return counted

    for name in calls:
        setattr(module, name, counting(name))
    engine_matches_transformers({LAB: module.__name__}, ["preemption"])
    assert calls["preempt"] > 0 and calls["allocate_or_preempt"] > calls["preempt"], calls
    engine, _ = run_workload({LAB: module.__name__}, WORKLOADS["preemption"])  # the engine counts them as its own
    assert engine.scheduler.num_preemptions == engine.summary().num_preemptions > 0


def test_a_rolled_back_step_gives_back_the_queue_around_the_learners_preemption():
    """A step whose forward fails is rolled back: its victims stay preempted, in front of the queue as it was."""
    from minengine.labs.preemption_lab import _running

    module = load_submission("minengine/labs/solutions/preemption.py")
    scheduler, _ = _running(module, 3, 8, 6)
    scheduler.add_request(Request("late", [5] * 4, SamplingParams(max_tokens=4), 0.0))
    r0 = next(iter(scheduler.running))
    r0.output_token_ids.extend([7, 7, 7])  # r0 needs a block: decode-first's victim r2 is preempted
    out = scheduler.schedule()
    assert out.preempted_ids == ["r2"] and scheduler.num_preemptions == 1
    scheduler.rollback(out)
    assert [r.request_id for r in scheduler.waiting] == ["r2", "late"]


def test_install_composes_the_step_builder_and_no_lab_leaves_it():
    labbed = LLMEngine(EngineConfig(labs={LAB: "minengine.labs.solutions.preemption"}, num_kv_blocks=16,
                                    max_model_len=64))
    assert issubclass(labbed.scheduler.step_builder_class, LabPreemption)
    assert issubclass(labbed.scheduler.step_builder_class, StepBuilder)
    plain = LLMEngine(EngineConfig(num_kv_blocks=16, max_model_len=64))
    assert plain.scheduler.step_builder_class is StepBuilder


def test_swap_preemption_is_refused():
    with pytest.raises(ValueError, match="preemption_mode='recompute'"):
        LLMEngine(EngineConfig(labs={LAB: "minengine.labs.solutions.preemption"}, preemption_mode="swap",
                               swap_space_bytes=1 << 20, num_kv_blocks=16, max_model_len=64))


def test_every_lab_of_the_engine_at_once():
    """Preemption, the policy, the attention read and the verification of proposals, all the learner's in one
    engine: the doors compose (the speculation door's ``run`` still reaches the lab's), and the tokens are still
    transformers'."""
    from minengine.labs.end_to_end import Workload
    from minengine.labs.spec_verify_lab import SPECULATIVE

    labs = {lab: f"minengine.labs.solutions.{lab}"
            for lab in ("preemption", "scheduling_policy", "paged_attention", "spec_verify")}
    tight = Workload("speculative, preemption", {**SPECULATIVE.settings, "num_kv_blocks": 20},
                     SPECULATIVE.prompts + WORKLOADS["preemption"].prompts, max_tokens=16)
    engine_matches_transformers(labs, [tight])
    engine, _ = run_workload(labs, tight)  # again, to look at what it did
    assert engine.scheduler.num_preemptions > 0 and engine.summary().spec_accepted_tokens > 0
    mro = [c.__name__ for c in engine.scheduler.step_builder_class.__mro__]
    assert mro.index("Speculation") < mro.index("LabPreemption") < mro.index("StepBuilder"), mro


def test_a_preemption_loop_that_never_ends_is_stopped_with_words(tmp_path):
    """A preempt that gives nothing back would make allocate_or_preempt loop forever: the grader stops it."""
    from pathlib import Path

    from minengine.labs.solutions import preemption as reference

    source = Path(reference.__file__).read_text()
    endless = source.replace("    step.running.remove(victim)\n    step.kv.free(victim)\n", "")
    assert endless != source
    path = tmp_path / "endless.py"
    path.write_text(endless)
    report = grade(LAB, path)
    (loop,) = [r for r in report.results if r.name.startswith("allocate_or_preempt")]
    assert loop.status == "failed" and "asked for slots 5 times with 3 requests running" in loop.message, loop


def test_the_door_refuses_false_while_the_request_still_runs():
    """Whatever the unit checks see, the door itself checks what ``allocate_or_preempt`` returned: False with the
    request still running (one victim preempted where two were needed) stops the engine with words."""
    from minengine.labs.preemption_lab import _running

    scheduler, step = _running(load_submission(wrong_files(LAB)["preempt_once"]), 3, 4, 3)
    r0 = next(iter(step.running))
    r0.output_token_ids.extend([7] * 7)  # 8 tokens to compute: 2 more blocks, one per victim
    with pytest.raises(LabFailure, match=r"allocate_or_preempt\(r0, 8 tokens\) returned False but r0 is RUNNING "
                                         r"and still running: False means it was preempted as its own victim"):
        step.run(r0)
    scheduler, step = _running(load_submission("minengine/labs/solutions/preemption.py"), 3, 4, 3)
    r0 = next(iter(step.running))
    r0.output_token_ids.extend([7] * 7)
    assert step.run(r0) == 8 and step.out.preempted_ids == ["r2", "r1"]
