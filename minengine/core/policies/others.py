"""The other scheduling policies (``EngineConfig.scheduling_policy``): each decides an order and caps, the
``StepBuilder`` does the mechanics."""

from __future__ import annotations

from collections.abc import Sequence

from minengine.core.policies.base import SchedulingPolicy, split_running
from minengine.core.step_builder import StepBuilder
from minengine.request import Request, RequestStatus


def _priority(request: Request) -> int:
    return request.priority


class PrefillFirst(SchedulingPolicy):
    """Unfinished prefill chunks and new prompts first, decodes fill what is left: requests start early
    (good TTFT and batch throughput) at the price of decode stalls (vLLM v0's default, Orca-style)."""

    name = "prefill-first"

    def fill(self, step: StepBuilder) -> None:
        decodes, prefills = split_running(step)
        step.run_all(prefills)
        # Admissions go before the decodes in the budget, but leave every running request the block of its next
        # token: the decodes' in this step, the prefills' in the next one (where they go first again).
        step.admit_all(reserve_running=True)
        step.run_all(decodes)


class Balanced(SchedulingPolicy):
    """The token budget split between prefill and decode by ``prefill_decode_ratio`` (prefill : decode).

    Decodes get their share first, then prefills (unfinished chunks, then new prompts) get theirs plus any
    unused decode share, then decodes get what prefill left. So each side is guaranteed its share whenever it
    has work, and no token of the budget is wasted.

    The decode share rotates: decodes are served least recently scheduled first (``split_running``), so
    when D decodes run and the share serves S of them (S tokens, one each), every decode is scheduled at
    least once every ``ceil(D / S)`` steps (it goes at most ``ceil(D / S) - 1`` steps without a token),
    instead of the same S being served every step while the others starve for the whole prefill. The share
    is at least one token (``decode_share``).
    """

    name = "balanced"

    def decode_share(self, budget: int) -> int:
        """Tokens of a ``budget`` reserved for decodes: ``budget / (1 + prefill_decode_ratio)``, rounded, and
        at least 1 (so no ratio lets a prefill starve every decode)."""
        ratio = self.settings.prefill_decode_ratio
        return max(1, budget - round(budget * ratio / (1 + ratio))) if budget > 0 else 0

    def fill(self, step: StepBuilder) -> None:
        decode_share = self.decode_share(step.budget)
        decodes, prefills = split_running(step)
        step.run_all(decodes, cap=decode_share)
        step.run_all(prefills)
        step.admit_all(reserve_running=True)  # as in prefill-first
        step.run_all(decodes)


class DynamicSplitFuse(SchedulingPolicy):
    """DeepSpeed-FastGen's Dynamic SplitFuse (Holmes et al., arXiv:2401.08671, 2024): every forward aims at the
    same size ``splitfuse_target_tokens``. All decodes run, and prefill chunks (split from long prompts, or
    several short prompts fused) take exactly what is left of the target: fewer prefill tokens when many
    decodes run, more when few."""

    name = "dynamic-splitfuse"

    def fill(self, step: StepBuilder) -> None:
        target = min(self.settings.splitfuse_target_tokens or step.budget, step.budget)
        decodes, prefills = split_running(step)
        prefill_cap = target - step.run_all(decodes)
        if prefill_cap > 0:
            prefill_cap -= step.run_all(prefills, cap=prefill_cap)
            step.admit_all(cap=prefill_cap)
        if step.is_empty:
            # Only without chunked prefill: a whole prompt larger than the target. Rather than an empty
            # step (and a stuck engine), let it take the full budget.
            step.admit_all()


class Priority(SchedulingPolicy):
    """Requests carry a priority; as in vLLM a SMALLER value is more urgent. The most urgent waiting request
    is admitted first, running requests are served most urgent first, and the least urgent running request
    (the most recently admitted among equals) is the preemption victim.

    Aging: a request's effective priority is ``priority - steps_in_system // priority_aging_steps``, so a
    request that has been in the system long enough beats any newcomer and cannot starve.
    """

    name = "priority"

    def effective_priority(self, request: Request, step_index: int) -> int:
        aging = self.settings.priority_aging_steps
        if aging <= 0:
            return request.priority
        return request.priority - (step_index - request.arrival_step) // aging

    def sort_key(self, step_index: int):
        """``effective_priority`` at ``step_index`` as a sort key (one inlined expression: a step sorts every
        running request)."""
        aging = self.settings.priority_aging_steps
        if aging <= 0:
            return _priority
        return lambda r: r.priority - (step_index - r.arrival_step) // aging

    def fill(self, step: StepBuilder) -> None:
        running = step.unscheduled_running()
        step.run_all(sorted(running, key=self.sort_key(step.step_index)))  # stable
        step.admit_all()

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=lambda r: self.effective_priority(r, step_index))  # ties: queue order

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        order = range(len(candidates))
        i = max(order, key=lambda i: (self.effective_priority(candidates[i], step_index), i))
        return candidates[i]


class RoundRobin(SchedulingPolicy):
    """Decodes first (as decode-first), then the prefill budget is shared equally between the prompts that
    want it: each unfinished prompt gets at most ``ceil(budget_left / n)`` tokens, n counting the unfinished
    prompts plus one for a waiting one, least recently served first; a waiting prompt is admitted with what
    is left. So a second long prompt starts at once and both advance every step, instead of the first
    holding the whole budget until it is done (head-of-line blocking).

    Running prompts are scheduled before admissions, as in decode-first: an admission never takes the blocks
    a running prompt needs, so two prompts cannot keep preempting each other.
    """

    name = "round-robin"

    def fill(self, step: StepBuilder) -> None:
        decodes, prefills = split_running(step)
        step.run_all(decodes)
        num_sharing = len(prefills) + (step.peek_waiting() is not None)
        if step.budget <= 0 or num_sharing == 0:
            return
        share = -(-step.budget // num_sharing)
        for request in sorted(prefills, key=lambda r: r.last_scheduled_step):  # stable: running order on ties
            if step.budget <= 0:
                break
            if request.status is RequestStatus.RUNNING and not step.is_scheduled(request):
                step.run(request, share)
        step.admit_all()


class ShortestPredictedFirst(SchedulingPolicy):
    """Shortest predicted remaining work first, with aging (predictive scheduling, ``core/predictors.py``).

    A request's score is its predicted remaining output, ``max(1, predicted_output_len - generated)`` tokens,
    minus one token for every ``predicted_length_aging_steps`` steps it has been in the system; as in vLLM's
    priority, SMALLER goes first. Running requests are served first (as decode-first, so a newcomer never
    stalls a decode), in score order; the waiting request with the smallest score is admitted next; the victim
    of a preemption is the running request with the largest score (the most predicted work left, the most
    recently admitted among equals).

    Shortest-job-first minimises mean latency when lengths are known, and ranking by a PREDICTED length keeps
    most of the gain (Fu et al., "Efficient LLM Scheduling by Learning to Rank", NeurIPS 2024; Qiu et al.,
    "Efficient Interactive LLM Serving with Proxy Model-based Sequence Length Prediction", 2024). Pure SJF
    starves long requests; aging bounds the wait: once a request has been in the system
    ``predicted_length_aging_steps x predicted_output_len`` steps its score is <= 0, below that of any
    newcomer (>= 1), so no request arriving after that is admitted before it (Fu et al. use a starvation
    counter to the same end). Without a predictor the scheduler predicts ``max_tokens`` (``OraclePredictor``).
    """

    name = "shortest-predicted-first"
    needs_predictor = True

    def score(self, request: Request, step_index: int) -> int:
        """Predicted remaining output tokens minus the aging credit (smaller = sooner)."""
        predicted = request.predicted_output_len
        if predicted is None:
            predicted = request.sampling_params.max_tokens
        remaining = max(1, predicted - request.num_output_tokens)
        aging = self.settings.predicted_length_aging_steps
        return remaining - (step_index - request.arrival_step) // aging if aging > 0 else remaining

    def fill(self, step: StepBuilder) -> None:
        running = step.unscheduled_running()
        step.run_all(sorted(running, key=lambda r: self.score(r, step.step_index)))  # stable: ties keep order
        step.admit_all()

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=lambda r: self.score(r, step_index))  # ties: queue order (preempted in front)

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        order = range(len(candidates))
        return candidates[max(order, key=lambda i: (self.score(candidates[i], step_index), i))]
