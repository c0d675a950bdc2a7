"""Lab 4, preemption by recompute: the spec (checks) and the install (the engine's step builder makes room and
preempts with the learner's functions).

The checks build real schedulers (``core/doors.make_scheduler``) whose step builder is the lab's
(``LabPreemption``), on KV pools small enough that requests must preempt each other: first each function on a
hand-made state, then random workloads driven step by step against the default engine's scheduler (token-free:
the "model" returns a fixed token), checking after every step that no request is lost, no block leaks, and the
preemptions are the ones the default scheduler makes; then the real engine on a small KV pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import ModuleType

from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.policies import DecodeFirst, make_policy
from minengine.core.step_builder import StepBuilder
from minengine.exceptions import VLLMValidationError
from minengine.labs.end_to_end import end_to_end_check
from minengine.labs.grading import Check, LabFailure
from minengine.labs.registry import SKELETONS, LabSpec
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams

LAB = "preemption"


def shown(value) -> str:
    """``value`` for a failure's words: a ``Request`` as "a Request object (r1), not its id" (its repr runs to
    ~1,500 characters), lists and tuples item by item, anything else as its repr."""
    if isinstance(value, Request):
        return f"a Request object ({value.request_id}), not its id"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return repr(value)


def _name(request) -> str:
    """A request the learner returned, by its id (or what it is instead of a Request)."""
    return request.request_id if isinstance(request, Request) else f"{shown(request)} (not a Request)"


class LabPreemption:
    """Step-builder mixin: ``run`` makes room with the learner's ``allocate_or_preempt``, and ``preempt`` is
    the learner's; around them the builder keeps its own books (the waiting queue as it was, which a rollback
    restores; the preemptions it counts), which the learner's functions need not know about."""

    lab_module: ModuleType

    def run(self, request: Request, limit: int | None = None) -> int:
        limit = self.budget if limit is None else min(limit, self.budget)
        num_uncomputed = self.num_uncomputed(request)
        num_new = min(1, limit) if num_uncomputed == 1 else self.config.chunk(num_uncomputed, limit)
        if num_new <= 0:
            return 0
        undo = self._undo_running(request)  # (also drops the builder's cached block needs)
        if self.kv.num_blocks_needed(request, num_new) > self.kv.num_free_blocks:
            self._waiting_changes()  # somebody will be preempted: keep the queue as it was, for a rollback
        num_preempted = len(self.out.preempted_ids)
        with allocation_guard(self, request, num_new):
            allocated = self.lab_module.allocate_or_preempt(self, request, num_new)
        self.num_preemptions += len(self.out.preempted_ids) - num_preempted
        check_allocation_outcome(self, request, num_new, allocated)
        if not allocated:
            return 0
        self.schedule_chunk(request, num_new, undo)
        return num_new

    def preempt(self, request: Request) -> None:
        self._waiting_changes()  # keep the queue as it was, for a rollback
        self._next_token_blocks = None
        self.lab_module.preempt(self, request)
        self.num_preemptions += 1


def check_allocation_outcome(step, request: Request, num_new: int, allocated) -> None:
    """The state ``allocate_or_preempt`` promised: False only when ``request`` was preempted as its own victim
    (off the running set, PREEMPTED), True only with slots for its ``num_new`` tokens.

    Raises:
        LabFailure: naming the request and what is wrong with its state.
    """
    call = f"allocate_or_preempt({request.request_id}, {num_new} tokens)"
    if allocated is not True and allocated is not False:
        raise LabFailure(f"{call} returned {shown(allocated)}: it returns True (slots allocated) or False (the request "
                         f"was its own victim)")
    if not allocated and (request in step.running or request.status is not RequestStatus.PREEMPTED):
        raise LabFailure(f"{call} returned False but {request.request_id} is {request.status.name} and "
                         f"{'still' if request in step.running else 'not'} running: False means it was preempted as "
                         f"its own victim. While allocate_slots fails and the victim is another request, preempt "
                         f"and try again: one victim's blocks may not be enough")
    if allocated and step.kv.num_blocks_needed(request, num_new) > 0:
        raise LabFailure(f"{call} returned True but {request.request_id} still lacks "
                         f"{step.kv.num_blocks_needed(request, num_new)} blocks for those tokens: True means "
                         f"allocate_slots gave the slots")


@contextlib.contextmanager
def allocation_guard(step, request: Request, num_new: int):
    """While the learner's ``allocate_or_preempt`` runs, ``step.kv.allocate_slots`` may fail at most once per
    request running when it started (each failure must be followed by a preemption that takes one off, so a
    loop that never ends, or never frees, stops here with words instead of hanging the grader)."""
    kv, limit = step.kv, len(step.running) + 1
    real, calls = kv.allocate_slots, 0

    def allocate_slots(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls > limit:
            raise LabFailure(f"allocate_or_preempt({request.request_id}, {num_new} tokens) asked for slots {calls} "
                             f"times with {limit - 1} requests running: every failed attempt must preempt a victim "
                             f"that gives back its blocks and leaves the running requests, or the loop never ends")
        return real(*args, **kwargs)

    kv.allocate_slots = allocate_slots  # this manager only, for this call
    try:
        yield
    finally:
        del kv.allocate_slots


def lab_step_builder(step_builder_class: type, module: ModuleType) -> type:
    """``step_builder_class`` (``StepBuilder``, or the doors' mixins composed over it by ``core/doors.py``) with
    the lab's preemption just above ``StepBuilder``: it replaces the default ``run`` and ``preempt`` only, and a
    door's ``run`` (speculation, async scheduling) still comes first and reaches it through ``super()``."""
    doors = [b for b in step_builder_class.__bases__ if b is not StepBuilder] if step_builder_class is not StepBuilder \
        else []
    lab = type("LabPreemption", (LabPreemption,), {"lab_module": module})
    return type(f"Lab{step_builder_class.__name__}", (*doors, lab, StepBuilder), {})


def install(engine, module: ModuleType) -> None:
    """``engine``'s scheduler preempts with ``module``'s ``allocate_or_preempt``, ``pick_victim`` and
    ``preempt`` (recompute).

    Raises:
        VLLMValidationError: naming ``labs``: with ``preemption_mode="swap"`` (the swap door evicts otherwise).
    """
    if engine.config.preemption_mode != "recompute":
        raise VLLMValidationError("the preemption lab is preemption by recompute: preemption_mode='recompute'",
                                  parameter="labs")
    scheduler = engine.scheduler
    scheduler.step_builder_class = lab_step_builder(scheduler.step_builder_class, module)


# ---- hand-made states ------------------------------------------------------------------------------------------
class OldestVictim(DecodeFirst):
    """Decode-first with the OLDEST candidate as the victim (so "the newest" is not the policy's choice)."""

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        return candidates[0]


def _running(module: ModuleType, num_requests: int, prompt_len: int, num_blocks: int, policy=None):
    """A scheduler (block_size 4, lab step builder) with ``num_requests`` running requests, each past its
    prefill; and a fresh (lab) step builder of its next step."""
    kv = KVCacheManager(num_blocks, 4, enable_prefix_caching=False)
    scheduler = make_scheduler(kv, 256, 8, 512, policy=policy or DecodeFirst())
    for i in range(num_requests):
        scheduler.add_request(Request(f"r{i}", list(range(1, prompt_len + 1)), SamplingParams(max_tokens=50), 0.0))
    while scheduler.waiting:  # the prefills, by the default step builder
        out = scheduler.schedule()
        scheduler.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.sample})
    scheduler.step_builder_class = lab_step_builder(scheduler.step_builder_class, module)
    return scheduler, scheduler.new_step()


def check_pick_victim(module: ModuleType) -> None:
    _, step = _running(module, 3, 6, 64)
    r0, r1, r2 = list(step.running)
    StepBuilder.run(step, r2)  # the newest is scheduled first in this step (by the engine's own run)
    got = module.pick_victim(step)
    if got is not r1:
        raise LabFailure(f"pick_victim: running r0, r1, r2 with r2 already scheduled in this step: the candidates are "
                         f"r0, r1 and decode-first's victim is the newest of them, r1; got {_name(got)} (a request "
                         f"scheduled in this step is never a victim)")
    _, step = _running(module, 3, 6, 64, policy=OldestVictim())
    got = module.pick_victim(step)
    if got is not list(step.running)[0]:
        raise LabFailure(f"pick_victim: with a policy whose victim is the OLDEST candidate (r0) the victim must be r0 "
                         f"(ask step.policy.pick_victim), got {_name(got)}")


def check_preempt(module: ModuleType) -> None:
    scheduler, step = _running(module, 3, 6, 64)
    kv, r1 = scheduler.kv, list(step.running)[1]
    free_before, held = kv.num_free_blocks, len(kv.req_to_blocks[r1.request_id])
    num_tokens, outputs = r1.num_tokens, list(r1.output_token_ids)
    module.preempt(step, r1)
    label = (f"preempt(r1) (running r0, r1, r2; r1 has {num_tokens} tokens, {len(outputs)} of them generated, in "
             f"{held} blocks)")
    if r1.output_token_ids != outputs:
        raise LabFailure(f"{label}: r1's generated tokens must stay: they were {outputs}, now "
                         f"{shown(r1.output_token_ids)}. Preemption by recompute drops K/V, not tokens: the user "
                         f"already has them, and the re-prefill computes prompt + generated again (prefill_len = "
                         f"num_tokens, with the generated tokens still counted)")
    problems = []
    if r1 in step.running:
        problems.append("r1 is still running")
    if not step.waiting or step.waiting[0] is not r1:
        problems.append(f"r1 must be the FIRST waiting request (it goes next); waiting is "
                        f"{[_name(r) for r in step.waiting]}")
    if kv.req_to_blocks.get(r1.request_id) or kv.num_free_blocks != free_before + held:
        still = len(kv.req_to_blocks.get(r1.request_id, ()))
        problems.append(f"all {held} of r1's blocks must be free: it still holds {still}, "
                        f"{kv.num_free_blocks - free_before} were freed")
    if r1.num_computed_tokens != 0:
        problems.append(f"num_computed_tokens must be 0 (its K/V is gone), got {r1.num_computed_tokens}")
    if r1.status is not RequestStatus.PREEMPTED:
        problems.append(f"status must be PREEMPTED, got {r1.status.name}")
    if r1.prefill_len != num_tokens:
        problems.append(f"prefill_len must be {num_tokens} (the re-prefill covers prompt + generated), got "
                        f"{r1.prefill_len}")
    if r1.num_preemptions != 1:
        problems.append(f"num_preemptions must be 1, got {r1.num_preemptions}")
    if step.out.preempted_ids != ["r1"]:
        problems.append(f"step.out.preempted_ids must be ['r1'], got {shown(step.out.preempted_ids)}")
    if problems:
        raise LabFailure(f"{label}: " + "; ".join(problems))


def check_allocate_or_preempt(module: ModuleType) -> None:
    # 3 requests of 8 prompt tokens (2 blocks of 4 each) fill the 6 blocks: r0's next tokens need a block.
    scheduler, step = _running(module, 3, 8, 6)
    r0, r1, r2 = list(step.running)
    r0.output_token_ids.extend([7, 7, 7])  # r0 now has 4 tokens to compute: one more block than it holds
    with allocation_guard(step, r0, 4):
        ok = module.allocate_or_preempt(step, r0, 4)
    if ok is not True or step.out.preempted_ids != ["r2"] or r2 not in step.waiting or r1 not in step.running:
        raise LabFailure(f"allocate_or_preempt(r0, 4 tokens) with every block in use: decode-first's victim r2 "
                         f"(the newest) must be preempted and r0 get its slots (True); got {shown(ok)}, "
                         f"preempted {shown(step.out.preempted_ids)}")
    # 3 requests of 4 prompt tokens (1 block each) fill the 3 blocks: r0's next 8 tokens need 2 more blocks, so
    # one victim's block is not enough: r2 then r1 go.
    scheduler, step = _running(module, 3, 4, 3)
    r0, r1, r2 = list(step.running)
    r0.output_token_ids.extend([7] * 7)
    with allocation_guard(step, r0, 8):
        ok = module.allocate_or_preempt(step, r0, 8)
    if ok is not True or step.out.preempted_ids != ["r2", "r1"] or list(step.running) != [r0]:
        raise LabFailure(f"allocate_or_preempt(r0, 8 tokens) needing 2 more blocks while r1 and r2 hold one each: "
                         f"both must be preempted (r2, then r1: keep preempting while the slots do not fit) and r0 "
                         f"get its slots (True); got {shown(ok)}, preempted {shown(step.out.preempted_ids)}, running "
                         f"{[r.request_id for r in step.running]}")
    scheduler, step = _running(module, 1, 8, 3)
    (r0,) = step.running
    r0.output_token_ids.extend([7] * 4)
    with allocation_guard(step, r0, 5):
        ok = module.allocate_or_preempt(step, r0, 5)
    if ok is not False or step.out.preempted_ids != ["r0"] or r0 in step.running or list(step.waiting) != [r0]:
        raise LabFailure(f"allocate_or_preempt(r0, 5 tokens) for the only running request, with no block free: r0 is "
                         f"its own victim: it must be preempted (waiting again) and the call return False; got "
                         f"{shown(ok)}, preempted {shown(step.out.preempted_ids)}, waiting "
                         f"{[_name(r) for r in step.waiting]}")


# ---- random workloads against the default scheduler --------------------------------------------------------------
def _pair(module: ModuleType, num_blocks: int, budget: int, policy: str):
    schedulers = []
    for lab in (False, True):
        kv = KVCacheManager(num_blocks, 4, enable_prefix_caching=True)
        chosen = OldestVictim() if policy == "oldest-victim" else make_policy(policy)
        scheduler = make_scheduler(kv, budget, 8, 4096, policy=chosen)
        if lab:
            scheduler.step_builder_class = lab_step_builder(scheduler.step_builder_class, module)
        schedulers.append(scheduler)
    return schedulers


def _check_states(scheduler, requests: list[Request], step: int) -> None:
    """No request lost or in two places; a waiting request holds no block and has nothing computed."""
    kv = scheduler.kv
    for r in requests:
        if scheduler.requests.get(r.request_id) is not r:  # finished, or not arrived yet
            continue
        places = [name for name, queue in (("running", scheduler.running), ("waiting", scheduler.waiting))
                  if r in queue]
        if places != ["running"] and places != ["waiting"]:
            raise LabFailure(f"after step {step}, request {r.request_id} ({r.status.name}) is in "
                             f"{' and '.join(places) or 'neither running nor waiting'}: a preempted request goes "
                             f"back to the waiting queue, once")
        if places == ["waiting"] and (kv.req_to_blocks.get(r.request_id) or r.num_computed_tokens):
            raise LabFailure(f"after step {step}, the waiting (preempted) request {r.request_id} holds "
                             f"{len(kv.req_to_blocks.get(r.request_id, ()))} blocks and {r.num_computed_tokens} "
                             f"computed tokens: preemption by recompute frees all its blocks and resets its progress")


VICTIM_RULES = {  # each property policy's pick_victim, in words
    "decode-first": "the newest candidate (the most recently admitted: vLLM's rule)",
    "prefill-first": "the newest candidate (the most recently admitted: prefill-first orders a step's work "
                     "differently from decode-first, but keeps vLLM's victim)",
    "priority": "the candidate with the largest priority value, the least urgent (ties: the newest)",
    "oldest-victim": "the oldest candidate (a policy the grader adds, so that 'the newest' is not always right)",
}


def record_victims(scheduler) -> list[tuple[list[str], str]]:
    """(candidates' ids, victim's id) of each ``pick_victim`` call of ``scheduler``'s policy, appended as they
    happen (the list is returned; the caller clears it between steps)."""
    calls, real = [], scheduler.policy.pick_victim

    def pick_victim(candidates, step_index):
        victim = real(candidates, step_index)
        calls.append(([r.request_id for r in candidates], victim.request_id))
        return victim

    scheduler.policy.pick_victim = pick_victim  # this scheduler's policy object only
    return calls


def victim_words(policy: str, calls: list[tuple[list[str], str]]) -> str:
    """Why the engine preempted whom in a step: each choice of the policy, its candidates, and its rule."""
    choices = "; ".join(f"among {', '.join(candidates)} it picks {victim}" for candidates, victim in calls)
    return (f"the engine asked the policy {policy!r} (each workload runs under a policy the grader draws: your "
            f"pick_victim must ask step.policy, whichever it is) for a victim among the candidates, the running "
            f"requests not yet scheduled in this step in admission order: {choices}. Its rule: "
            f"{VICTIM_RULES[policy]}")


def _step_summary(out) -> str:
    return (f"scheduled {[(s.request_id, s.num_new_tokens) for s in out.scheduled]}, preempted "
            f"{shown(out.preempted_ids)}")


def run_against_default(module: ModuleType, prompts: list[int], max_tokens: list[int], arrivals: list[int],
                        num_blocks: int, budget: int, policy: str) -> None:
    """Drive the default scheduler and the lab's in lockstep on the same workload (prompt lengths, outputs,
    arrival steps); every step must schedule and preempt the same, and no request or block may be lost."""
    default, lab = _pair(module, num_blocks, budget, policy)
    victims = record_victims(default)
    pairs = []
    for i, (n, m) in enumerate(zip(prompts, max_tokens)):
        prompt = [(i * 31 + j * 7) % 97 for j in range(n)]
        pairs.append(tuple(Request(f"r{i}", list(prompt), SamplingParams(max_tokens=m, ignore_eos=True), 0.0,
                                   priority=i % 3) for _ in range(2)))
    for step in range(1, 3000):
        for (a, b), arrival in zip(pairs, arrivals):
            if arrival == step - 1:
                default.add_request(a)
                lab.add_request(b)
        if not default.has_unfinished_requests() and step > max(arrivals) + 1:
            break
        victims.clear()
        expected, got = default.schedule(), lab.schedule()
        _check_states(lab, [b for _, b in pairs], step)
        if _step_summary(expected) != _step_summary(got):
            same_victims = expected.preempted_ids == [getattr(v, "request_id", v) for v in got.preempted_ids]
            why = ("" if same_victims or not victims else
                   f". Why the engine's victims: {victim_words(policy, victims)}")
            raise LabFailure(f"step {step} (the grader's policy {policy}, {num_blocks} blocks of 4): the engine's "
                             f"preemption "
                             f"{_step_summary(expected)}; yours {_step_summary(got)}{why}")
        for scheduler, out in ((default, expected), (lab, got)):
            scheduler.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.sample})
    else:
        raise LabFailure("the workload did not finish within 3000 steps")
    if lab.kv.num_free_blocks != num_blocks:
        raise LabFailure(f"every request finished but {num_blocks - lab.kv.num_free_blocks} of {num_blocks} blocks "
                         f"are still held: a preemption leaked blocks")


def check_random_workloads(module: ModuleType) -> None:
    """Random prompts, outputs, arrivals, pools (each request fits alone) and policies."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=20, derandomize=True, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20), st.integers(0, 4)), min_size=3,
                            max_size=7),
           spare_blocks=st.integers(0, 3), budget=st.sampled_from([8, 32, 256]),
           policy=st.sampled_from(["decode-first", "priority", "oldest-victim", "prefill-first"]))
    def random_workload(lengths, spare_blocks, budget, policy):
        prompts, outputs, arrivals = (list(x) for x in zip(*lengths))
        num_blocks = max(-(-(p + m) // 4) for p, m in zip(prompts, outputs)) + spare_blocks
        run_against_default(module, prompts, outputs, arrivals, num_blocks, budget, policy)

    random_workload()


SPEC = LabSpec(
    name=LAB, title="Preemption by recompute", order=4, minutes=60,
    teaches="what a server does when KV memory runs out: the policy's victim among the requests not yet scheduled, "
            "every block given back, and the request re-queued first to be prefilled again where it was",
    part="preemption (StepBuilder.run's allocation loop and StepBuilder.preempt, minengine/core/step_builder.py)",
    skeleton=SKELETONS / LAB / f"{LAB}.py", solution=f"minengine.labs.solutions.{LAB}",
    checks=[
        Check("pick_victim: the policy's choice among the running requests not yet scheduled", "unit",
              check_pick_victim),
        Check("preempt: off running, every block freed, progress reset, first in waiting, recorded", "unit",
              check_preempt),
        Check("allocate_or_preempt: preempt until the slots fit; False when the request is its own victim", "unit",
              check_allocate_or_preempt),
        Check("random workloads on small pools: the engine's schedule and preemptions, nothing lost", "property",
              check_random_workloads),
        Check("the engine on your preemption matches transformers: a small KV pool", "end_to_end",
              end_to_end_check(LAB, ["preemption", "prefix_hits"])),
    ],
    install=install,
)
