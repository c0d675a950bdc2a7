"""A dashboard workload: the requests of one run, as plain frozen data (hashable, so a run can be cached
on config + workload), independent of any engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadRequest:
    """One request to replay.

    Attributes:
        request_id: unique within the workload.
        prompt_token_ids: the prompt, token ids in the model's vocabulary (>= 1 token).
        max_tokens: output tokens to generate (EOS is ignored, so exactly this many unless max_model_len
            cuts it).
        arrival_time: seconds after the run starts, on the run's clock (see ``runner.run_workload``).
        arrival_step: when set, the request arrives right before this engine step (0-based) instead; used
            where "arrives while the others are decoding" must hold on any machine speed.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_time: float = 0.0
    arrival_step: int | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Workload:
    """The requests of one run, plus a note for the page about how it was scaled to fit a CPU.

    Attributes:
        name: preset key ("a".."e") or a free name.
        requests: the requests, any order (the runner adds them by arrival).
        scale_note: (i18n key, format fields as sorted (name, value) pairs) of the on-screen scale note, or
            None when nothing was scaled.
    """

    name: str
    requests: tuple[WorkloadRequest, ...]
    scale_note: tuple[str, tuple[tuple[str, object], ...]] | None = None

    def __post_init__(self) -> None:
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError("workload has duplicate request_id values")
        if not self.requests:
            raise ValueError("workload has no requests")
        for r in self.requests:
            if not r.prompt_token_ids:
                raise ValueError(f"request {r.request_id}: prompt must have at least 1 token")
            if r.max_tokens < 1:
                raise ValueError(f"request {r.request_id}: max_tokens must be >= 1, got {r.max_tokens}")
            if r.arrival_time < 0:
                raise ValueError(f"request {r.request_id}: arrival_time must be >= 0 s, got {r.arrival_time}")

    @property
    def max_request_len(self) -> int:
        """The longest request, prompt + output, in tokens (the run's max_model_len)."""
        return max(r.prompt_len + r.max_tokens for r in self.requests)
