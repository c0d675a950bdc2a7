"""Lab 5, a scheduling policy of the learner's design: the spec (checks) and the install (the engine's scheduler
builds every step with the learner's ``MyPolicy``).

Graded on what a policy is for, not on equality with a reference: replayed on the modelled clock (an H100 with
Llama-3-8B shapes, ``minengine.timing``) through the real engine on a token-free runner
(``minengine.fleet.token_free``), the held trace's SLO attainment (``minengine.workloads.goodput``) must be at
least that of the default policy, decode-first. Before that, the mechanics every policy must respect, checked
after every step of random traces on a small KV pool: a step never holds more than ``max_num_batched_tokens``,
a step is never empty while requests are unfinished, the preemption victim is always one of the candidates.
Last, the real model on the learner's policy gives transformers' greedy tokens.
"""

from __future__ import annotations

import functools
import random
from types import ModuleType

from minengine.config import EngineConfig
from minengine.core.policies import SchedulingPolicy
from minengine.exceptions import VLLMValidationError
from minengine.labs.end_to_end import end_to_end_check
from minengine.labs.grading import Check, LabFailure
from minengine.labs.registry import SKELETONS, LabSpec
from minengine.request import RequestStatus
from minengine.workloads.goodput import SLO, slo_attainment
from minengine.workloads.traces import TraceRequest

LAB = "scheduling_policy"
HELD_SLO = SLO(ttft_s=0.25, tpot_s=0.022)
HELD_CONFIG = dict(max_num_batched_tokens=2048, max_num_seqs=64, num_kv_blocks=1200, block_size=16,
                   max_model_len=8192)
MODEL_SHAPE = "llama-3-8b"  # the modelled clock's shape (an H100 is its default hardware)


def lab_trace(num_requests: int, rate: float, seed: int) -> list[TraceRequest]:
    """Poisson arrivals at ``rate`` requests/s: 4 in 5 are chats (64-512 prompt tokens, 32-160 out), 1 in 5 long
    documents (2,000-4,000 prompt tokens, 8-32 out)."""
    rng = random.Random(seed)
    t, trace = 0.0, []
    for i in range(num_requests):
        t += rng.expovariate(rate)
        long_doc = rng.random() < 0.2
        prompt_len = rng.randint(2000, 4000) if long_doc else rng.randint(64, 512)
        output_len = rng.randint(8, 32) if long_doc else rng.randint(32, 160)
        trace.append(TraceRequest(t, prompt_len, output_len, None, f"q{i}"))
    return trace


def held_trace() -> list[TraceRequest]:
    """The trace the attainment is graded on: 120 requests at 25/s (the engine is overloaded at times)."""
    return lab_trace(120, 25.0, seed=5)


class CheckedVictim:
    """Policy mixin: the learner's ``pick_victim`` must return one of the candidates."""

    def pick_victim(self, candidates, step_index):
        victim = super().pick_victim(candidates, step_index)
        if not any(victim is c for c in candidates):
            raise LabFailure(f"pick_victim returned {getattr(victim, 'request_id', victim)!r}, which is not one of the "
                             f"candidates {[c.request_id for c in candidates]} (running requests not yet scheduled in "
                             f"this step; preempting any other would free blocks the step reads)")
        return victim


def learner_policy(module: ModuleType) -> SchedulingPolicy:
    """An instance of the learner's ``MyPolicy`` (checked: a ``SchedulingPolicy``)."""
    policy_class = getattr(module, "MyPolicy", None)
    if not (isinstance(policy_class, type) and issubclass(policy_class, SchedulingPolicy)):
        raise LabFailure("the submission must define class MyPolicy(SchedulingPolicy)")
    return type(f"Checked{policy_class.__name__}", (CheckedVictim, policy_class), {})()


def install(engine, module: ModuleType) -> None:
    """``engine`` builds every step with ``module.MyPolicy`` (whose victims are checked to be candidates).

    Raises:
        VLLMValidationError: naming ``labs``: with the chunked_prefill lab too (both write the step's order).
    """
    if "chunked_prefill" in engine.config.labs:
        raise VLLMValidationError("the scheduling_policy and chunked_prefill labs both write the step's order (a "
                                  "policy's fill): run one of them at a time", parameter="labs")
    use_learner_policy(engine.scheduler, module)


class MoveLimit:
    """Step-builder mixin: a learner's ``fill`` that keeps making moves (``run``, ``admit_next``) without end,
    e.g. admitting while nothing can be admitted, stops with words instead of hanging the engine. A step makes at
    most a few moves per request (``run_all`` one per running request, ``admit_all`` one per waiting one + 1).
    ``run`` is also held to its contract, which ``run_all`` keeps by skipping: a request that is RUNNING and not
    yet scheduled in this step (a victim preempted earlier in the step is neither)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.moves_left = 8 * (len(self.running) + len(self.waiting)) + 64

    def _count_move(self) -> None:
        self.moves_left -= 1
        if self.moves_left < 0:
            raise LabFailure(f"step {self.step_index}: the policy's fill made more moves (run, admit_next) than "
                             f"8 per request + 64 with {len(self.running)} running and {len(self.waiting)} waiting: "
                             f"a loop that never ends (admitting or running while nothing more fits?)")

    def run(self, request, limit=None):
        self._count_move()
        if request.status is not RequestStatus.RUNNING:
            raise LabFailure(f"step {self.step_index}: the policy's fill called step.run on request "
                             f"{request.request_id}, whose status is {request.status.name}: it was preempted earlier "
                             f"in this step (another request's run made room). step.run takes a running request not "
                             f"yet scheduled; step.run_all skips the others")
        if self.is_scheduled(request):
            raise LabFailure(f"step {self.step_index}: the policy's fill called step.run on request "
                             f"{request.request_id} twice in one step (step.run_all skips requests already "
                             f"scheduled)")
        return super().run(request, limit)

    def admit_next(self, limit=None, reserve_running=False):
        self._count_move()
        return super().admit_next(limit, reserve_running)


def use_learner_policy(scheduler, module: ModuleType) -> None:
    """``scheduler`` builds its steps with the learner's ``MyPolicy``, its moves counted (``MoveLimit``)."""
    scheduler.policy = learner_policy(module)
    builder = scheduler.step_builder_class
    scheduler.step_builder_class = type(f"MoveLimit[{builder.__name__}]", (MoveLimit, builder), {})


def replay_with(module: ModuleType | None, trace: list[TraceRequest], max_steps: int, **config):
    """``trace`` replayed on the modelled clock through a token-free engine built on the learner's policy (the
    lab door, ``EngineConfig.labs``; ``module`` None: the default, decode-first); every step checked (budget,
    not empty while work is left). Returns the ``ReplayResult``."""
    from minengine.engine.llm_engine import LLMEngine
    from minengine.fleet.token_free import TokenFreeRunner
    from minengine.labs.door import LabLLMEngine
    from minengine.timing.clocks import ModelledClock
    from minengine.timing.cost_model import StepCostModel
    from minengine.workloads.replay import replay

    labs = {LAB: module.__name__} if module is not None else None
    engine_config = EngineConfig(labs=labs, **{**HELD_CONFIG, **config})
    runner = TokenFreeRunner(MODEL_SHAPE)
    clock = ModelledClock(StepCostModel("h100", runner.shape, block_size=engine_config.block_size))
    # with a runner handed in, LLMEngine keeps its class: the lab door's engine is asked for by name
    engine = (LLMEngine if labs is None else LabLLMEngine)(engine_config, clock=clock, runner=runner)
    budget = engine.config.max_num_batched_tokens

    def check_step(trace) -> None:
        tokens = sum(c.num_tokens for c in trace.chunks)
        if tokens > budget:
            raise LabFailure(f"step {trace.step} scheduled {tokens} tokens, over max_num_batched_tokens={budget}")
        if not trace.chunks:
            raise LabFailure(f"step {trace.step} scheduled nothing while {trace.num_running} requests ran and "
                             f"{trace.num_waiting} waited: {_stuck(engine)}")

    try:
        return replay(engine, trace, max_steps=max_steps, on_step=check_step)
    except RuntimeError as e:  # max_steps, or the engine's own guard against a step with nothing scheduled
        raise LabFailure(f"the trace did not finish ({e}): {_stuck(engine)}") from None


def _stuck(engine) -> str:
    scheduler = engine.scheduler
    running = [f"{r.request_id} ({r.num_computed_tokens} of {r.num_tokens} tokens computed)"
               for r in list(scheduler.running)[:3]]
    waiting = [r.request_id for r in list(scheduler.waiting)[:3]]
    return (f"running {running or 'none'}, waiting {waiting or 'none'}: every step must serve the running "
            f"requests (decodes and the next chunks of prompts) and admit waiting ones")


@functools.lru_cache(maxsize=1)
def baseline() -> tuple[float, int]:
    """Decode-first on the held trace: (SLO attainment, steps)."""
    result = replay_with(None, held_trace(), max_steps=100_000)
    return slo_attainment(result.request_metrics, HELD_SLO), len(result.steps)


# ---- checks ------------------------------------------------------------------------------------------------------
def _one_step(module: ModuleType, num_running: int, num_waiting: int):
    """A scheduler on the learner's policy with ``num_running`` decoding requests and ``num_waiting`` new
    prompts (budget and blocks to spare); returns its next step's ``SchedulerOutput``."""
    from minengine.core.doors import make_scheduler
    from minengine.core.kv_cache_manager import KVCacheManager
    from minengine.request import Request
    from minengine.sampling_params import SamplingParams

    scheduler = make_scheduler(KVCacheManager(64, 16, True), 512, 8, 1024)  # decode-first admits the running ones
    requests = [Request(f"r{i}", [i + 1] * 20, SamplingParams(max_tokens=50), 0.0)
                for i in range(num_running + num_waiting)]
    for request in requests[:num_running]:
        scheduler.add_request(request)
    if num_running:
        out = scheduler.schedule()
        scheduler.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.sample})
    for request in requests[num_running:]:
        scheduler.add_request(request)
    use_learner_policy(scheduler, module)
    return scheduler.schedule()


def check_admits_when_idle(module: ModuleType) -> None:
    out = _one_step(module, 0, 1)
    if [s.request_id for s in out.scheduled] != ["r0"]:
        raise LabFailure(f"a step with nothing running and one waiting prompt of 20 tokens (budget 512, 64 free "
                         f"blocks) must admit it; it scheduled {[s.request_id for s in out.scheduled]}")


def check_serves_running(module: ModuleType) -> None:
    out = _one_step(module, 2, 0)
    if sorted(s.request_id for s in out.scheduled) != ["r0", "r1"]:
        raise LabFailure(f"a step with two running decodes and nothing waiting (budget 512) must serve both; it "
                         f"scheduled {[s.request_id for s in out.scheduled]}")


def check_random_traces(module: ModuleType) -> None:
    """Small random traces on a small KV pool (preemptions happen): every step within the budget, none empty
    while work is left, every victim a candidate, every request finished."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=6, derandomize=True, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10**6), rate=st.sampled_from([10.0, 40.0]), budget=st.sampled_from([512, 2048]))
    def random_trace(seed, rate, budget):
        trace = lab_trace(30, rate, seed)
        result = replay_with(module, trace, max_steps=20_000, num_kv_blocks=300,
                             max_num_batched_tokens=budget)
        unfinished = [rid for rid, reason in result.finish_reasons.items() if reason is None]
        if unfinished:
            raise LabFailure(f"requests {unfinished[:5]} never finished (trace seed {seed})")

    random_trace()


def attainment(submission) -> tuple[float, float]:
    """(the learner's SLO attainment, decode-first's) on the held trace, fractions of its requests: what the grade
    compares, to look at from a notebook whether the policy passes or not.

    Args:
        submission: the learner's file path, module name or module.

    Raises:
        LabFailure: the submission does not import, or its policy stalls the trace (more than 10x decode-first's
            steps, or a step with nothing scheduled).
    """
    from minengine.labs.loading import load_submission

    base, base_steps = baseline()
    result = replay_with(load_submission(submission), held_trace(), max_steps=10 * base_steps)
    return slo_attainment(result.request_metrics, HELD_SLO), base


def check_slo_attainment(module: ModuleType) -> None:
    attained, base = attainment(module)
    if attained < base:
        n = len(held_trace())
        raise LabFailure(f"SLO attainment ({HELD_SLO}) on the held trace (modelled H100, Llama-3-8B shapes): "
                         f"{attained:.1%} ({round(attained * n)} of {n} requests) is below decode-first's {base:.1%} "
                         f"({round(base * n)} of {n})")


SPEC = LabSpec(
    name=LAB, title="A scheduling policy of your own", order=5, minutes=90,
    teaches="what a step's order and caps do to TTFT and TPOT: a policy graded on SLO attainment against "
            "decode-first on a held trace, on the modelled clock, not on equality with an answer",
    part="the scheduling policy (SchedulingPolicy, minengine/core/policies/)",
    skeleton=SKELETONS / LAB / f"{LAB}.py", solution=f"minengine.labs.solutions.{LAB}",
    checks=[
        Check("a step with nothing running admits the waiting prompt", "unit", check_admits_when_idle),
        Check("a step with budget to spare serves every running decode", "unit", check_serves_running),
        Check("random traces on a small KV pool: steps within the budget, never empty, victims among the "
              "candidates, every request finished", "property", check_random_traces),
        Check("SLO attainment on the held trace at least decode-first's (modelled H100, Llama-3-8B)", "end_to_end",
              check_slo_attainment),
        Check("the engine on your policy matches transformers: chunked prefill, preemption", "end_to_end",
              end_to_end_check(LAB, ["chunked_prefill", "preemption"])),
    ],
    install=install,
)
