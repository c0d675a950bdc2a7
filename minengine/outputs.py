"""RequestOutput, CompletionOutput, Logprob and RequestMetrics: what the engine returns (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minengine.request import Request


@dataclass
class RequestMetrics:
    """Per-request timing on the engine clock (seconds) and counters.

    ``ttft`` is arrival -> first token (queueing and every prefill chunk included); ``tpot`` is
    ``(e2e - ttft) / (n - 1)`` for n output tokens (None when n < 2); ``itls`` are the gaps between
    consecutive output tokens (the inter-token latencies, ITL/TBT).
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop", "length", "abort", "timeout" once finished
    itls: list[float] = field(default_factory=list)

    @property
    def time_in_queue(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        if self.finished_time is None or self.first_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.finished_time - self.first_token_time) / (self.num_output_tokens - 1)

    def on_scheduled(self, now: float) -> None:
        """The request was scheduled at ``now`` (only its first time counts: the queueing delay)."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now

    def on_tokens(self, request: Request, num_new_tokens: int, now: float) -> None:
        """The request got ``num_new_tokens`` tokens at ``now``: its first token (TTFT) or the gap since its last
        (appended to ``request.token_times`` too); accepted speculative proposals arrive together, gap 0."""
        if self.first_token_time is None:
            self.first_token_time = now
            self.num_cached_tokens = request.num_cached_tokens
        else:
            self.itls.append(now - request.token_times[-1])
        request.token_times.append(now)
        for _ in range(num_new_tokens - 1):
            self.itls.append(0.0)
            request.token_times.append(now)
        self.num_output_tokens = request.num_output_tokens

    def on_finished(self, request: Request, now: float) -> None:
        self.finished_time = now
        self.num_output_tokens = request.num_output_tokens
        self.num_preemptions = request.num_preemptions
        self.finish_reason = request.status.finish_reason


@dataclass
class Logprob:
    """One token's log-probability at one position (vLLM's ``Logprob``): natural log, from the raw model
    distribution; ``rank`` 1 is the most likely token; ``decoded_token`` its text (None without a tokenizer)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: {token id: Logprob}, the sampled (or prompt) token first, then the top alternatives by rank.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One generated sequence: ``text`` (cut before a stop string), ``token_ids`` and why it ended.

    ``index`` numbers the sequences of a request with ``n > 1``. ``logprobs`` (one dict per generated token)
    and ``cumulative_logprob`` (their sum over the sampled tokens) are None unless the request asked for
    ``logprobs``. With ``output_kind=DELTA``, ``text``, ``token_ids`` and ``logprobs`` hold only what is new.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after a step (cumulative by default; see ``SamplingParams.output_kind``).

    ``outputs`` holds one ``CompletionOutput`` per sequence (``n`` of them, by ``index``; with DELTA only the
    sequences that changed). ``prompt_logprobs`` has one entry per prompt token (None for the first) when
    the request asked for them. For ``n > 1``, ``metrics`` are those of the sequence with index 0.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
