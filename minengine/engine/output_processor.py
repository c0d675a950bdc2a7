"""OutputProcessor: turns requests' progress into ``RequestOutput``s (vLLM v1's ``OutputProcessor``).

It keeps, per request, what has been sent already, so it can hand out cumulative, delta or final-only outputs
(``SamplingParams.output_kind``); the logprobs the sampler computed; and the parents of ``n > 1`` requests,
whose children's completions it gathers (``parallel_sampling.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minengine.engine.logprobs_positions import LogprobsPositions
from minengine.engine.parallel_sampling import ParentRequest
from minengine.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput
from minengine.request import Request
from minengine.sampling_params import RequestOutputKind

if TYPE_CHECKING:  # the sampler imports torch; an engine on a model-free runner (minengine.fleet) runs without it
    pass


_FINAL_ONLY, _DELTA = RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA  # read once: ~1 us a read (Python 3.11)


def streamable_length(text: str, stop: list[str]) -> int:
    """How much of an unfinished request's text can be streamed for good: all of it except an incomplete
    UTF-8 character at the end (decoded as U+FFFD) and a tail that could still grow into a stop string
    (which would be cut off). Once the request finishes, everything is final."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    for s in stop:
        for k in range(min(len(s) - 1, end), 0, -1):  # longest tail that is a proper prefix of s
            if text.endswith(s[:k], 0, end):
                end -= k
                break
    return end


@dataclass
class _RequestState:
    """What one engine request has produced and sent so far."""

    request_id: str
    index: int
    output_kind: RequestOutputKind
    stop: list[str]
    parent: ParentRequest | None = None
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    sent_text: int = 0
    sent_tokens: int = 0
    sent_logprobs: int = 0
    sent_prompt_logprobs: bool = False


@dataclass
class OutputProcessor:
    """Builds the outputs of each step. ``tokenizer`` (or None) decodes the tokens of logprobs.

    Attributes:
        states: request id -> its state, for every unfinished engine request.
        parents: parent id -> ``ParentRequest``, for unfinished ``n > 1`` requests.
    """

    tokenizer: object = None
    states: dict[str, _RequestState] = field(default_factory=dict)
    parents: dict[str, ParentRequest] = field(default_factory=dict)
    logprobs_positions: LogprobsPositions = field(init=False)  # ``engine/logprobs_positions.py``

    def __post_init__(self) -> None:
        self.logprobs_positions = LogprobsPositions(self.tokenizer)

    def add_request(self, request: Request, index: int = 0, parent: ParentRequest | None = None) -> None:
        p = request.sampling_params
        self.states[request.request_id] = _RequestState(
            request_id=request.request_id, index=index, output_kind=p.output_kind, stop=list(p.stop), parent=parent,
            logprobs=[] if p.logprobs is not None else None,
            cumulative_logprob=0.0 if p.logprobs is not None else None,
            prompt_logprobs=[None] if p.prompt_logprobs is not None else None)
        if parent is not None:
            self.parents[parent.request_id] = parent

    def is_in_use(self, request_id: str) -> bool:
        """True while a request or a parent of that id is unfinished."""
        return request_id in self.states or request_id in self.parents

    def children_of(self, request_id: str) -> list[str]:
        """The engine request ids behind a caller's id: its children for a parent, else the id itself."""
        if request_id in self.parents:
            return [rid for rid, s in self.states.items() if s.parent is not None and s.parent.request_id == request_id]
        return [request_id]

    def caller_id(self, request_id: str) -> str:
        """The id the caller knows an engine request by: its parent's for a child of an ``n > 1`` request."""
        state = self.states.get(request_id)
        return state.parent.request_id if state is not None and state.parent is not None else request_id

    # ---- outputs -------------------------------------------------------------------------------------
    def _completion(self, state: _RequestState, request: Request, text: str) -> CompletionOutput | None:
        """This step's completion of one engine request in its output kind (None: nothing to send)."""
        finished = request.is_finished
        if finished and isinstance(request.stop_reason, str) and request.sampling_params.include_stop_str_in_output:
            text += request.stop_reason  # the detokenizer cut the text right before the stop string it found
        kind = state.output_kind
        if kind == _FINAL_ONLY and not finished:
            return None
        tokens, logprobs = request.output_token_ids, state.logprobs
        if kind == _DELTA:
            end = len(text) if finished else max(state.sent_text, streamable_length(text, state.stop))
            new_text, state.sent_text = text[state.sent_text:end], end
            tokens, state.sent_tokens = tokens[state.sent_tokens:], len(tokens)
            if logprobs is not None:
                logprobs, state.sent_logprobs = logprobs[state.sent_logprobs:], len(logprobs)
            text = new_text
        return CompletionOutput(index=state.index, text=text, token_ids=list(tokens),
                                cumulative_logprob=state.cumulative_logprob,
                                logprobs=list(logprobs) if logprobs is not None else None,
                                finish_reason=request.status.finish_reason, stop_reason=request.stop_reason)

    def _prompt_logprobs(self, state: _RequestState):
        if state.prompt_logprobs is None or (state.output_kind == RequestOutputKind.DELTA
                                             and state.sent_prompt_logprobs):
            return None
        state.sent_prompt_logprobs = True
        return list(state.prompt_logprobs)

    def make_outputs(self, items: list[tuple[Request, str]], metrics: dict[str, RequestMetrics]) -> list[RequestOutput]:
        """The outputs of one step, in ``items`` order (a parent's at the position of its first child).

        Args:
            items: (engine request, its detokenized text so far) for every request that got a token or
                finished this step. Finished ones are forgotten afterwards.
            metrics: the engine's ``request_metrics``.
        """
        outputs: list[RequestOutput | ParentRequest] = []
        updated: dict[str, list[CompletionOutput]] = {}
        for request, text in items:
            state = self.states.get(request.request_id)
            if state is None:
                continue
            completion = self._completion(state, request, text)
            parent = state.parent
            if parent is None:
                if completion is not None:
                    outputs.append(RequestOutput(
                        request_id=request.request_id, prompt=request.prompt,
                        prompt_token_ids=request.prompt_token_ids, outputs=[completion],
                        finished=request.is_finished, metrics=metrics[request.request_id],
                        num_cached_tokens=request.num_cached_tokens, prompt_logprobs=self._prompt_logprobs(state)))
            else:
                if parent.request_id not in updated:
                    updated[parent.request_id] = []
                    outputs.append(parent)
                parent.add_child_step(state.index, state.prompt_logprobs, completion, request.is_finished,
                                      updated[parent.request_id])
            if request.is_finished:
                del self.states[request.request_id]
        result = []
        for out in outputs:
            if isinstance(out, ParentRequest):  # its children's completions of this step, gathered
                if out.finished:
                    self.parents.pop(out.request_id, None)
                out = out.request_output(updated[out.request_id])
            if out is not None:
                result.append(out)
        return result

    def abort(self, request_ids: list[str]) -> None:
        """Forget aborted engine requests (no output is made for them, as in vLLM); a parent whose children
        are all gone is forgotten too."""
        for rid in request_ids:
            state = self.states.pop(rid, None)
            if state is not None and state.parent is not None:
                state.parent.unfinished.discard(state.index)
                if state.parent.finished:
                    self.parents.pop(state.parent.request_id, None)
