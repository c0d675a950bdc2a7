"""Parallel sampling (``SamplingParams.n > 1``) as vLLM v1 does it: fan one request out into n child requests
and gather their completions back into the parent's ``RequestOutput``.

The scheduler never sees ``n``: each child is an ordinary request (``"{index}_{parent id}"``), and the
children share the prompt's full KV blocks through the prefix cache, so the prompt is prefilled about once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minengine.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput
from minengine.request import Request, RequestGroup
from minengine.sampling_params import RequestOutputKind, SamplingParams


def child_request_id(parent_id: str, index: int) -> str:
    """vLLM's child id: ``f"{index}_{parent_id}"``."""
    return f"{index}_{parent_id}"


def child_sampling_params(params: SamplingParams, index: int) -> SamplingParams:
    """The params of child ``index``: ``n=1`` and, when seeded, ``seed + index`` (vLLM's rule), so the
    children differ and each is reproducible."""
    child = params.clone()
    child.n, child.best_of = 1, None
    if params.seed is not None:
        child.seed = params.seed + index
    return child


def make_children(make_request, request_id: str, prompt, params: SamplingParams, arrival_time, priority: int,
                  deadline) -> RequestGroup:
    """The ``params.n`` child requests of an ``n > 1`` request (``make_request``: ``InputProcessor.make_request``),
    the prompt tokenized once: ids ``"{index}_{request_id}"``, seeds ``seed + index`` (vLLM's parallel sampling)."""
    first = make_request(child_request_id(request_id, 0), prompt, child_sampling_params(params, 0), arrival_time,
                         priority, deadline)
    tokenized = {"prompt_token_ids": first.prompt_token_ids, "prompt": first.prompt}
    children = [first] + [make_request(child_request_id(request_id, i), tokenized, child_sampling_params(params, i),
                                       first.arrival_time, priority, deadline) for i in range(1, params.n)]
    return RequestGroup(request_id, params, children)


@dataclass
class ParentRequest:
    """Gathers the completions of a parent's children (vLLM's ``ParentRequest``).

    Attributes:
        request_id: the parent id; n: children; output_kind: the parent's ``RequestOutputKind``.
        first_child: child 0 (its prompt, cached tokens); metrics: child 0's ``RequestMetrics``.
        latest: index -> the child's latest ``CompletionOutput`` (cumulative or final).
        unfinished: indices of the children still running.
        prompt_logprobs: child 0's prompt logprobs (the prompt is the same for all).
    """

    request_id: str
    n: int
    output_kind: RequestOutputKind
    first_child: Request
    metrics: RequestMetrics
    latest: dict[int, CompletionOutput] = field(default_factory=dict)
    unfinished: set[int] = field(default_factory=set)
    prompt_logprobs: list[PositionLogprobs | None] | None = None

    def __post_init__(self) -> None:
        self.unfinished = set(range(self.n))

    @property
    def finished(self) -> bool:
        return not self.unfinished

    def update(self, completion: CompletionOutput, child_finished: bool) -> None:
        """Record a child's new completion (already in the parent's output kind)."""
        self.latest[completion.index] = completion
        if child_finished:
            self.unfinished.discard(completion.index)

    def outputs(self, updated: list[CompletionOutput]) -> list[CompletionOutput] | None:
        """The completions of the parent's output this step, or None when there is nothing to send.

        DELTA: only the children updated this step; CUMULATIVE: every child that has produced output so far;
        FINAL_ONLY: all n, once every child has finished.
        """
        if self.output_kind == RequestOutputKind.FINAL_ONLY:
            return [self.latest[i] for i in sorted(self.latest)] if self.finished else None
        if self.output_kind == RequestOutputKind.DELTA:
            return sorted(updated, key=lambda c: c.index)
        return [self.latest[i] for i in sorted(self.latest)]

    def add_child_step(self, index: int, prompt_logprobs: list[PositionLogprobs | None] | None,
                       completion: CompletionOutput | None, child_finished: bool,
                       updated: list[CompletionOutput]) -> None:
        """Child ``index``'s step: its completion (None: nothing to send; else appended to ``updated``, the
        parent's completions of this step) and whether it finished. Child 0 brings the prompt logprobs."""
        if self.prompt_logprobs is None and index == 0:
            self.prompt_logprobs = prompt_logprobs
        if completion is not None:
            self.update(completion, child_finished)
            updated.append(completion)
        elif child_finished:
            self.unfinished.discard(index)

    def request_output(self, updated: list[CompletionOutput]) -> RequestOutput | None:
        """The parent's ``RequestOutput`` of this step (``outputs(updated)`` with child 0's prompt), or None
        when there is nothing to send."""
        completions = self.outputs(updated)
        if completions is None or not (completions or self.finished):
            return None
        first = self.first_child
        return RequestOutput(
            request_id=self.request_id, prompt=first.prompt, prompt_token_ids=first.prompt_token_ids,
            outputs=completions, finished=self.finished, metrics=self.metrics,
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=list(self.prompt_logprobs) if self.prompt_logprobs is not None else None)
