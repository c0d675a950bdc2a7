"""SamplingParams: how one request samples and when it stops (vLLM's names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass

SAMPLING_EPS = 1e-5  # vLLM's threshold under which a temperature means greedy


@dataclass
class SamplingParams:
    """Sampling and stopping settings of one request.

    Attributes:
        temperature: 0 (or below 1e-5) means greedy (argmax); > 0 divides the logits before softmax.
        top_p: nucleus sampling, keep the smallest set of tokens whose probability sums to >= top_p; in (0, 1].
        top_k: keep the k most likely tokens; -1 means all (0 is rejected, as in current vLLM).
        max_tokens: the most tokens to generate (>= 1).
        stop: strings that end generation; the returned text is cut before the stop string.
        stop_token_ids: token ids that end generation (the token is kept in ``token_ids``).
        ignore_eos: keep generating past the model's EOS token.
        seed: per-request seed; the request's samples then depend on nothing else in the batch.
        skip_special_tokens: drop special tokens from the returned text.

    Raises:
        ValueError: naming the field and the allowed range.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.verify()

    def verify(self) -> None:
        """Check every field; raises ``ValueError`` naming the first bad one."""
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t < float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must hold non-negative integers, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool) or not isinstance(self.skip_special_tokens, bool):
            raise ValueError(f"ignore_eos and skip_special_tokens must be bools, got {self.ignore_eos!r}, "
                             f"{self.skip_special_tokens!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """Temperatures below 1e-5 sample greedily (as vLLM): dividing logits by them would overflow."""
        return self.temperature < SAMPLING_EPS
