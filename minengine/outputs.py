"""RequestOutput, CompletionOutput and RequestMetrics: what the engine returns (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass
class CompletionOutput:
    """One generated sequence: ``text`` (cut before a stop string), ``token_ids`` and why it ended."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after a step (cumulative, as vLLM's default output kind)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
