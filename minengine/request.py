"""Request and RequestStatus: one generation request and its progress through the engine; RequestGroup: what
the engine queues for one caller's request (the request, or the children of an ``n > 1`` one)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from minengine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """WAITING -> RUNNING -> FINISHED_*, and RUNNING -> PREEMPTED (recompute) or SWAPPED (KV copied to the
    CPU swap space) -> (waiting queue) -> RUNNING."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_TIMEOUT = "timeout"

    @property
    def finished(self) -> bool:
        return self._value_ in _FINISHED_VALUES  # by value: reading enum members from the class is ~15x slower

    @property
    def finish_reason(self) -> str | None:
        """vLLM's ``finish_reason``: "stop", "length", "abort", "timeout" (past its deadline) or None while
        unfinished."""
        return self._value_ if self._value_ in _FINISHED_VALUES else None


_FINISHED_VALUES = frozenset({"stop", "length", "abort", "timeout"})  # the values of the FINISHED_* members


@dataclass(eq=False)
class Request:
    """One request's tokens and progress. Requests compare (and hash) by identity: two requests are the same
    only when they are the same object, so the scheduler keeps them in sets and finds one in O(1).

    The request's tokens are ``prompt_token_ids + output_token_ids``. Its progress is one number,
    ``num_computed_tokens``: how many of those tokens have their K/V in the paged cache. Chunked prefill
    (fewer new tokens than remain), prefix-cache hits (start above 0) and recompute after preemption
    (back to 0, outputs kept) are all just moves of this number.

    Times are in seconds on the engine's clock.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    eos_token_id: int | None = None
    prompt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Async scheduling: tokens that steps still in flight sample for it, not yet known (vLLM's
    # num_output_placeholders). Those steps' positions already count in num_computed_tokens (the device runs the
    # steps in order, so every later step sees their K/V); each placeholder becomes a token in output_token_ids
    # when its step's output arrives. Always 0 without async scheduling.
    num_output_placeholders: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    # Prefix-cache: chained hashes of the full blocks of all_token_ids (filled by the KV cache manager).
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    # Leading tokens whose KV arrives from elsewhere at admission (vLLM's KV connector; a disaggregated decode
    # replica receiving a prefill's KV): admission allocates their blocks and counts them computed, once.
    num_external_computed_tokens: int = 0
    num_preemptions: int = 0
    # Tokens the current (re)prefill covers: the prompt, and after a recompute preemption the prompt plus the
    # outputs so far. Until all of them are computed the request is prefilling, its last token included (vLLM
    # v0's SequenceStage), so a resumed request is never mistaken for a decode. -1: the prompt (set below).
    prefill_len: int = -1
    # Scheduling policy inputs. As in vLLM, a SMALLER priority value is more urgent (0 is the default).
    priority: int = 0
    deadline: float | None = None  # engine-clock seconds after which the request finishes with "timeout"
    arrival_step: int = 0  # the scheduler's step count when the request was added (for priority aging)
    last_scheduled_step: int | None = None  # the last step that computed tokens for it (round-robin)
    # Swap preemption: the CPU swap-space blocks holding its KV while it waits (empty when not swapped).
    swapped_block_ids: list[int] = field(default_factory=list)
    # Predictive scheduling: the output length (tokens, in all) an ``OutputLengthPredictor`` gave it when it was
    # added (core/predictors.py); None without a predictor.
    predicted_output_len: int | None = None
    # Speculative decoding: the n-gram proposer's index of this request's tokens (core/spec_decode.py).
    spec_index: object | None = field(default=None, repr=False, compare=False)
    # Structured outputs: the grammar state after the committed output tokens (``worker/structured_output.py``'s
    # ``StructuredOutputRequest``; core only calls its ``accept_token`` and ``is_terminated``). It lives here, with
    # the outputs, so a recompute preemption keeps it and a rolled-back step never advanced it. None: unconstrained.
    structured_output: object | None = field(default=None, repr=False, compare=False)
    # Timestamps (engine clock, seconds).
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.prefill_len < 0:
            self.prefill_len = len(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """All known tokens: prompt + generated."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n]

    @property
    def is_decode(self) -> bool:
        """True when the next step computes exactly one token, the one the request sampled in its previous
        step (a decode). False while its (re)prefill is unfinished: a recompute-preempted request re-prefills
        prompt + outputs, and computing its last known token is still part of that prefill."""
        return (self.num_tokens + self.num_output_placeholders - self.num_computed_tokens == 1
                and self.num_computed_tokens >= self.prefill_len)

    @property
    def is_finished(self) -> bool:
        return self.status._value_ in _FINISHED_VALUES  # ``self.status.finished``, without a second property


@dataclass
class RequestGroup:
    """A validated request ready to queue: one ``Request`` (``n == 1``) or the ``n`` children of a parent
    (``engine/parallel_sampling.py``).

    Attributes:
        request_id: the id the caller gave (the parent's for n > 1).
        params: the caller's ``SamplingParams`` (with ``n``).
        requests: the engine requests to queue (children in index order).
    """

    request_id: str
    params: SamplingParams
    requests: list[Request]

    @property
    def is_parent(self) -> bool:
        return self.params.n > 1
