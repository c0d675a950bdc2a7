"""Lab 3, chunked_prefill: the learner writes how a step's token budget is split: the chunk size of a request
(budget, ``long_prefill_token_threshold``, no chunking), the KV blocks a chunk needs, the admission rule against the
free blocks, and the order (decodes, then running prefills, then new prompts). The engine's scheduler then builds
every step with them: the learner's ``fill_step`` is the policy's ``fill``, ``prefill_chunk`` sizes every chunk and
``admission_chunk`` every first chunk."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import ClassVar

from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler import Scheduler
from minengine.core.scheduler_config import SchedulerConfig
from minengine.core.step_builder import StepBuilder
from minengine.exceptions import VLLMValidationError
from minengine.labs.door import mix_into
from minengine.labs.end_to_end import end_to_end_check
from minengine.labs.grading import Check, LabFailure, expect_equal, hypothesis_settings
from minengine.labs.registry import SKELETONS, LabSpec
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams


class LearnersChunking(SchedulerConfig):
    """The scheduler's limits, with chunk sizes from the learner's ``prefill_chunk`` (``lab_module``)."""

    __slots__ = ()
    lab_module: ClassVar[ModuleType]

    def chunk(self, num_uncomputed: int, token_budget: int) -> int:
        num_new = self.lab_module.prefill_chunk(num_uncomputed, token_budget, self.long_prefill_token_threshold,
                                                self.enable_chunked_prefill)
        if not 0 <= num_new <= min(num_uncomputed, token_budget):
            raise RuntimeError(f"prefill_chunk({num_uncomputed}, {token_budget}, ...) gave {num_new} tokens: a "
                               f"chunk must be in [0, min(tokens left, budget left)]")
        return num_new


class LearnersAdmission(StepBuilder):
    """The step builder, with first chunks from the learner's ``admission_chunk`` and the learner's ``fill_step``
    held to the moves' rules (a request runs once per step, and only while it is running)."""

    lab_module: ClassVar[ModuleType]

    def run(self, request: Request, limit: int | None = None) -> int:
        if request.status is not RequestStatus.RUNNING:
            raise RuntimeError(f"fill_step ran request {request.request_id}, whose status is {request.status.name}: "
                               "it was preempted earlier in this step; skip requests that are no longer RUNNING")
        if self.is_scheduled(request):
            raise RuntimeError(f"fill_step ran request {request.request_id} twice in one step")
        return super().run(request, limit)

    def first_chunk(self, request: Request, limit: int, free: int) -> int:
        hit_blocks, num_hit = self.kv.get_computed_blocks(request)
        free -= sum(1 for b in hit_blocks if b.ref_cnt == 0)  # hit blocks in the free queue are taken back
        cfg = self.config
        num_new = self.lab_module.admission_chunk(request.num_tokens - num_hit, num_hit, len(hit_blocks), limit,
                                                  free, self.kv.block_size, cfg.long_prefill_token_threshold,
                                                  cfg.enable_chunked_prefill)
        if num_new <= 0:
            return 0
        if num_new > min(limit, request.num_tokens - num_hit):
            raise RuntimeError(f"admission_chunk gave {num_new} tokens to request {request.request_id} with "
                               f"{request.num_tokens - num_hit} left and {limit} of the budget left")
        needed = self.kv.num_blocks_needed(request, num_new, len(hit_blocks))
        if needed > free:
            raise RuntimeError(f"admission_chunk admitted request {request.request_id} with {num_new} tokens "
                               f"needing {needed} new blocks, but only {free} are free")
        self.kv.allocate_slots(request, num_new, hit_blocks)
        request.num_computed_tokens = num_hit
        request.num_external_computed_tokens = 0  # received KV is not part of this lab: it is recomputed
        self._count_prefix_hit(request, num_hit)
        return num_new


class LearnersFill:
    """A policy's ``fill`` replaced by the learner's ``fill_step`` (its queue order and victim choice stay)."""

    lab_module: ClassVar[ModuleType]

    def fill(self, step: StepBuilder) -> None:
        self.lab_module.fill_step(step)


def install_on_scheduler(scheduler: Scheduler, module: ModuleType) -> None:
    """Make ``scheduler`` build its steps with the learner's functions (its policy's queue order and victim stay).

    Raises:
        VLLMValidationError: naming ``labs``: a scheduler with another door open (async scheduling, swap
            preemption, speculative decoding, predicted admission) or the admission probe: this lab replaces the
            default step's chunking, which those change too.
    """
    if type(scheduler) is not Scheduler or scheduler.step_builder_class is not StepBuilder:
        raise VLLMValidationError("the chunked_prefill lab replaces the default step's chunking: it runs without "
                                  "async scheduling, swap preemption, speculative decoding and predicted admission",
                                  parameter="labs")
    if scheduler.config.shrink_prefill_chunks:
        raise VLLMValidationError("the chunked_prefill lab runs without shrink_prefill_chunks", parameter="labs")
    chunking = type("LearnersChunking", (LearnersChunking,), {"__slots__": (), "lab_module": module})
    scheduler.config = chunking(**{f.name: getattr(scheduler.config, f.name) for f in fields(SchedulerConfig)})
    scheduler.step_builder_class = type("LearnersAdmission", (LearnersAdmission,), {"lab_module": module})
    mix_into(scheduler.policy, type("LearnersFill", (LearnersFill,), {"lab_module": module}))


def install(engine, module: ModuleType) -> None:
    """The engine's scheduler builds every step with the learner's chunking, admission and order."""
    install_on_scheduler(engine.scheduler, module)


# ---- a model-free scheduler to watch the steps ------------------------------------------------------------------
@dataclass
class Scenario:
    """Requests arriving at a scheduler (no model: each sampled token is 5), its steps compared with the reference.

    Attributes:
        name: how failures name it.
        settings: ``budget``, ``threshold``, ``chunked``, ``num_blocks``, ``block_size``, ``max_num_seqs``.
        arrivals: step -> [(request id, prompt length, max_tokens)].
    """

    name: str
    settings: dict
    arrivals: dict = field(default_factory=dict)


class Harness:
    """The real ``Scheduler`` and ``KVCacheManager`` with the learner's module installed, stepped without a model."""

    def __init__(self, module: ModuleType, budget: int, threshold: int = 0, chunked: bool = True,
                 num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8):
        self.kv = KVCacheManager(num_blocks, block_size, True)
        self.scheduler = make_scheduler(self.kv, budget, max_num_seqs, 1024, chunked, threshold)
        install_on_scheduler(self.scheduler, module)

    def add(self, request_id: str, prompt_len: int, max_tokens: int) -> None:
        first = 10 + 100 * (sum(map(ord, request_id)) % 50)  # different prompts, no accidental prefix hits
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        self.scheduler.add_request(Request(request_id, list(range(first, first + prompt_len)), params, 0.0))

    def step(self) -> tuple[list[tuple[str, int]], list[str]]:
        """One step: ([(request id, tokens)] in scheduling order, preempted request ids)."""
        out = self.scheduler.schedule()
        self.scheduler.update_from_output(out, {s.request_id: [5] for s in out.scheduled if s.sample})
        return [(s.request_id, s.num_new_tokens) for s in out.scheduled], list(out.preempted_ids)

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)


def _check_step(scenario: Scenario, index: int, scheduled: list, harness: Harness) -> None:
    """The invariants of every step, in words."""
    s = scenario.settings
    where = f"{scenario.name}, step {index}: scheduled {scheduled}"
    total = sum(n for _, n in scheduled)
    if total > s["budget"]:
        raise LabFailure(f"{where}: {total} tokens, over the budget max_num_batched_tokens={s['budget']}")
    ids = [r for r, _ in scheduled]
    if len(set(ids)) != len(ids):
        raise LabFailure(f"{where}: a request is scheduled twice in one step")
    free = harness.kv.num_free_blocks
    if free < 0 or free > s.get("num_blocks", 64):
        raise LabFailure(f"{where}: {free} free KV blocks")


def run_scenario(module: ModuleType, scenario: Scenario, max_steps: int = 300) -> None:
    """Step the learner's scheduler and the reference's side by side; every step must schedule the same requests
    with the same tokens in the same order, and preempt the same requests.

    Raises:
        LabFailure: naming the scenario, the step, expected vs got.
    """
    from minengine.labs.solutions import chunked_prefill as reference

    learner, ref = Harness(module, **scenario.settings), Harness(reference, **scenario.settings)
    for index in range(max_steps):
        for args in scenario.arrivals.get(index, []):
            learner.add(*args)
            ref.add(*args)
        if not ref.busy and index > max(scenario.arrivals, default=0):
            if learner.busy:
                raise LabFailure(f"{scenario.name}: after {index} steps every request should be finished, but some are "
                                 "still running or waiting")
            return
        expected, got = ref.step(), learner.step()
        _check_step(scenario, index, got[0], learner)
        expect_equal(f"{scenario.name}, step {index}: (request, tokens) in scheduling order", expected[0], got[0])
        expect_equal(f"{scenario.name}, step {index}: requests preempted", expected[1], got[1])
    raise LabFailure(f"{scenario.name}: not finished after {max_steps} steps")


SCENARIOS = {
    "decodes_first": Scenario("two decodes and two long prompts (budget 8, threshold 4)",
                              dict(budget=8, threshold=4),
                              {0: [("A", 1, 6), ("B", 1, 6)], 1: [("P1", 30, 2), ("P2", 30, 2)]}),
    "threshold": Scenario("three prompts (budget 12, threshold 5)", dict(budget=12, threshold=5),
                          {0: [("X", 13, 2), ("Y", 7, 2), ("Z", 3, 2)]}),
    "no_chunking": Scenario("three prompts without chunked prefill (budget 10)", dict(budget=10, chunked=False),
                            {0: [("X", 6, 2), ("Y", 6, 2), ("Z", 3, 2)]}),
    "free_blocks": Scenario("two prompts in 6 KV blocks of 4 (budget 32)", dict(budget=32, num_blocks=6),
                            {0: [("X", 13, 3), ("Y", 9, 3)]}),
    "preemption": Scenario("three growing requests in 6 KV blocks of 4 (budget 16)", dict(budget=16, num_blocks=6),
                           {0: [("A", 3, 20), ("B", 3, 20), ("C", 3, 20)]}),
}


def check_prefill_chunk(m: ModuleType) -> None:
    cases = [((1, 5, 0, True), 1, "a decode"), ((1, 0, 0, True), 0, "a decode with no budget left"),
             ((1, 5, 3, True), 1, "a decode under a threshold"), ((10, 4, 0, True), 4, "a prompt over the budget"),
             ((10, 20, 0, True), 10, "a prompt within the budget"),
             ((10, 20, 3, True), 3, "a prompt over the threshold"),
             ((10, 2, 3, True), 2, "the budget below the threshold"),
             ((10, 20, 3, False), 10, "no chunked prefill: the whole prompt fits (the threshold does not apply)"),
             ((10, 9, 0, False), 0, "no chunked prefill: the prompt does not fit, it waits"),
             ((10, 10, 0, True), 10, "a prompt of exactly the budget left (it fits)"),
             ((10, 10, 0, False), 10, "no chunked prefill: a prompt of exactly the budget left (it fits whole)"),
             ((3, 20, 3, True), 3, "a prompt of exactly the threshold")]
    for args, expected, words in cases:
        expect_equal(f"prefill_chunk{args}, {words}", expected, m.prefill_chunk(*args))


def check_blocks_needed(m: ModuleType) -> None:
    cases = [((0, 5, 0, 4), 2, "5 tokens from scratch"), ((0, 8, 0, 4), 2, "exactly 2 blocks of tokens"),
             ((5, 3, 2, 4), 0, "8 tokens in the 2 blocks held"), ((8, 1, 2, 4), 1, "one token past 2 full blocks"),
             ((4, 4, 1, 4), 1, "a second block"), ((0, 0, 0, 4), 0, "no tokens"),
             ((7, 0, 3, 4), 0, "more blocks held than needed (never negative)"), ((3, 10, 1, 1), 12, "block_size 1")]
    for args, expected, words in cases:
        expect_equal(f"blocks_needed{args}, {words}", expected, m.blocks_needed(*args))


def check_admission_chunk(m: ModuleType) -> None:
    # (uncomputed, computed, held, budget, free, block_size, threshold, chunked)
    cases = [((10, 0, 0, 6, 5, 4, 0, True), 6, "2 blocks for a 6-token chunk, 5 free"),
             ((10, 0, 0, 10, 2, 4, 0, True), 0, "10 tokens need 3 blocks, 2 free: it waits"),
             ((8, 0, 0, 10, 2, 4, 0, True), 8, "8 tokens need exactly the 2 free blocks"),
             ((10, 0, 0, 6, 9, 4, 0, False), 0, "no chunked prefill, the prompt over the budget"),
             ((6, 0, 0, 6, 2, 4, 0, False), 6, "no chunked prefill, the prompt fits"),
             ((5, 8, 2, 10, 2, 4, 0, True), 5, "a prefix hit of 8 tokens in 2 blocks, 5 left need 2 more"),
             ((5, 8, 2, 10, 1, 4, 0, True), 0, "the same with 1 free block"),
             ((10, 0, 0, 10, 9, 4, 3, True), 3, "a threshold of 3")]
    for args, expected, words in cases:
        expect_equal(f"admission_chunk{args}, {words}", expected, m.admission_chunk(*args))


def _scenario_check(key: str):
    def check(m: ModuleType) -> None:
        run_scenario(m, SCENARIOS[key])
    return check


def check_random_scenarios(m: ModuleType) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    request = st.tuples(st.integers(1, 30), st.integers(1, 6))

    @hypothesis_settings(40)
    @given(st.integers(2, 24), st.integers(0, 8), st.booleans(), st.integers(1, 4),
           st.dictionaries(st.integers(0, 6), st.lists(request, min_size=1, max_size=3), min_size=1, max_size=3))
    def scenario(budget, threshold, chunked, block_size, arrivals):
        num_blocks = -(-40 // block_size) + 2  # one request alone always fits (prompt 30 + 6 outputs + slack)
        settings = dict(budget=budget if chunked else max(budget, 30), threshold=threshold if chunked else 0,
                        chunked=chunked, block_size=block_size, num_blocks=num_blocks, max_num_seqs=4)
        named = {step: [(f"r{step}.{i}", n, k) for i, (n, k) in enumerate(reqs)] for step, reqs in arrivals.items()}
        run_scenario(m, Scenario(f"random scenario {settings}, arrivals {named}", settings, named))

    scenario()


SPEC = LabSpec(
    name="chunked_prefill", title="Chunked prefill: the step's token budget", order=3, minutes=60,
    teaches="how a step is filled: decodes first so no stream stalls, prompts in chunks under the token budget and "
            "the prefill threshold, and admission only when the KV blocks fit (Sarathi-Serve's stall-free batching)",
    part="the step's token-budget split (minengine/core/step_builder.py, policies/decode_first.py)",
    skeleton=SKELETONS / "chunked_prefill" / "chunked_prefill.py", solution="minengine.labs.solutions.chunked_prefill",
    checks=[
        Check("prefill_chunk: decodes, the budget, the threshold, no chunking", "unit", check_prefill_chunk),
        Check("blocks_needed: ceil of the tokens, minus the blocks held", "unit", check_blocks_needed),
        Check("admission_chunk: a first chunk only when its blocks fit", "unit", check_admission_chunk),
        Check("fill_step: decodes before prefill chunks", "unit", _scenario_check("decodes_first")),
        Check("fill_step: chunks under the threshold and the budget", "unit", _scenario_check("threshold")),
        Check("fill_step: without chunked prefill a prompt runs whole", "unit", _scenario_check("no_chunking")),
        Check("fill_step: a prompt waits for free KV blocks", "unit", _scenario_check("free_blocks")),
        Check("fill_step: a request preempted in the step is skipped", "unit", _scenario_check("preemption")),
        Check("random arrivals: every step as the reference's", "property", check_random_scenarios),
        Check("the engine on your step matches transformers: chunked prefill, preemption", "end_to_end",
              end_to_end_check("chunked_prefill", ["chunked_prefill", "preemption"])),
    ],
    install=install,
)
