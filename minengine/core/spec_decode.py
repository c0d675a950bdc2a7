"""Speculative decoding by prompt lookup (n-gram): the proposer, and how a verified step is read back.

Idea: a model often copies from its own context (code edits, summaries, quotes, repeated names). Prompt lookup
decoding (Saxena, 2023; vLLM's ``method="ngram"``) needs no draft model: take the last n tokens of a request,
find the same n-gram earlier in its own prompt + output, and propose the k tokens that followed it there. The
target model then checks all k proposals in ONE forward (Leviathan et al., "Fast Inference from Transformers via
Speculative Decoding", ICML 2023; Chen et al., "Accelerating Large Language Model Decoding with Speculative
Sampling", 2023): a decode of 1 + k tokens, scheduled like a small prefill chunk in the same flattened step as
other requests' chunks and decodes, under the same token budget and KV block budget.

In minengine speculative tokens are just more pending tokens of a request (``ARCHITECTURE.md``):
- ``Scheduler.schedule()`` asks ``NgramProposer.propose`` for a running decode's proposals and schedules
  ``[last token] + proposals`` (``ScheduledRequest.spec_token_ids``), if the budget and FREE blocks allow:
  speculation never preempts anybody (it leaves a block for every running request not yet scheduled);
- the sampler verifies the k + 1 positions (``worker/sampler.py``) and returns the accepted proposals plus one
  token of its own (the correction at the first mismatch, or the bonus token after k accepted ones);
- ``Scheduler.update_from_output`` appends them and advances ``num_computed_tokens`` by their count (the K/V of
  the accepted proposals was written by the verifying forward); the K/V slots of rejected proposals lie beyond
  ``num_computed_tokens`` and are simply overwritten later, and a block that only rejected proposals used is
  given back at once. No block holding a rejected proposal is ever indexed in the prefix cache.

No torch here: the proposer works on token id lists, so the scheduler stays testable without a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SPEC_METHODS = ("ngram",)
MAX_SPECULATIVE_TOKENS = 64


def _int_at_least(name: str, value, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"speculative_config.{name} must be an integer {bound}, got {value!r}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config`` for prompt lookup: ``{"method": "ngram", "num_speculative_tokens": k,
    "prompt_lookup_max": n_max, "prompt_lookup_min": n_min}``.

    Attributes:
        method: "ngram" (the only one: proposals from the request's own tokens, no draft model).
        num_speculative_tokens: k, the most tokens proposed per request per step (1..64).
        prompt_lookup_max: the longest n-gram (suffix of the request's tokens) looked up.
        prompt_lookup_min: the shortest; a suffix shorter than this never proposes. As in vLLM, when only one
            of the two is given the other takes its value, and when neither is given both are 5.

    Raises:
        ValueError: naming the field, for an unknown method, k out of [1, 64], n-gram bounds < 1 or min > max.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative_config.method must be one of {SPEC_METHODS} (prompt lookup; minengine "
                             f"has no draft models), got {self.method!r}")
        _int_at_least("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = 5  # vLLM's defaults
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        _int_at_least("prompt_lookup_min", lo, 1)
        _int_at_least("prompt_lookup_max", hi, 1)
        if lo > hi:
            raise ValueError(f"speculative_config.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)

    @classmethod
    def from_any(cls, value: SpeculativeConfig | Mapping | None) -> SpeculativeConfig | None:
        """A ``SpeculativeConfig`` from itself, a dict with vLLM's keys, or None (speculation off).

        Raises:
            ValueError: not a dict / ``SpeculativeConfig`` / None, an unknown key, or a bad value.
        """
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative_config must be a dict like {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, a SpeculativeConfig or None, got {value!r}")
        known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown} (minengine knows {sorted(known)}; "
                             "draft models are not supported)")
        return cls(**dict(value))


class NgramIndex:
    """Where each n-gram of one request's tokens FIRST occurs, for n in [n_min, n_max], kept up to date as the
    tokens grow (they only ever grow: outputs are appended, never removed; preemption keeps them).

    ``first[n][ngram]`` is the start of the earliest occurrence that has at least one token after it, so a
    look-up of the request's last n tokens finds an earlier occurrence, never the suffix itself. Each new
    token adds one n-gram per n: O(n_max - n_min + 1) per token, O(1) per look-up, memory one entry per
    distinct n-gram (a cyclic text of period p holds p entries per n, whatever its length).
    """

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.first: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.num_indexed = 0  # n-grams ending before this position are indexed

    def extend(self, request) -> None:
        """Index the n-grams of ``request``'s known tokens that are followed by at least one known token."""
        end = request.num_tokens - 1  # an n-gram must end before the last token to have a follower
        for stop in range(self.num_indexed + 1, end + 1):  # the n-grams ending at position stop - 1
            for n, first in self.first.items():
                if stop >= n:
                    first.setdefault(tuple(request.token_ids_slice(stop - n, stop)), stop - n)
        self.num_indexed = max(self.num_indexed, end)

    def lookup(self, request) -> tuple[int, int] | None:
        """The longest n (n_max down to n_min) whose suffix (``request``'s last n tokens) occurred earlier, and
        where its earliest occurrence ends: (n, position of the first token after it); None without a match."""
        end = request.num_tokens
        for n in range(min(self.n_max, end - 1), self.n_min - 1, -1):
            start = self.first[n].get(tuple(request.token_ids_slice(end - n, end)))
            if start is not None:
                return n, start + n
        return None


class NgramProposer:
    """Prompt-lookup proposals from a request's own prompt + output (vLLM v1's ``NgramProposer``: the longest
    matching n-gram in [``prompt_lookup_min``, ``prompt_lookup_max``], its earliest occurrence, then the
    tokens that followed it, at most ``num_speculative_tokens``).

    The per-request index lives on the request (``Request.spec_index``), so it goes when the request goes and
    survives preemption (a request's tokens never shrink). Its first use indexes the whole prompt (O(prompt
    length)); later ones only the tokens added since.

    Args:
        config: the ``SpeculativeConfig``.
    """

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self.k = config.num_speculative_tokens

    def propose(self, request, max_tokens: int | None = None) -> list[int]:
        """Up to ``min(k, max_tokens)`` token ids that might follow ``request``'s known tokens (empty when its
        last n-gram occurred nowhere earlier, or ``max_tokens <= 0``).

        Args:
            request: a ``Request`` (``token_ids_slice``, ``num_tokens``, ``spec_index``).
            max_tokens: a further cap (what the token budget, ``max_tokens`` and ``max_model_len`` leave).
        """
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        if k <= 0 or request.num_tokens <= self.config.prompt_lookup_min:
            return []
        index = request.spec_index
        if index is None:
            index = request.spec_index = NgramIndex(self.config.prompt_lookup_min, self.config.prompt_lookup_max)
        index.extend(request)
        hit = index.lookup(request)
        if hit is None:
            return []
        follow = hit[1]
        return request.token_ids_slice(follow, min(follow + k, request.num_tokens))


@dataclass(frozen=True)
class SpecDecodeStats:
    """Speculation counts of one step or a whole run (vLLM's ``SpecDecodingStats``).

    Attributes:
        num_drafts: (request, step) pairs that carried proposals.
        num_draft_tokens: tokens proposed.
        num_accepted_tokens: proposals the target model accepted.
        num_accepted_tokens_per_pos: accepted proposals by position in the draft (0 = first proposed token).
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed tokens (NaN when nothing was proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a drafted decode produced on average: 1 (its own token) + accepted proposals per draft, as
        vLLM reports it (NaN without drafts)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @classmethod
    def of_steps(cls, traces) -> SpecDecodeStats:
        """The counts over ``StepTrace``s (their chunks' ``num_spec_tokens`` and ``num_accepted_tokens``)."""
        drafts = proposed = accepted = 0
        per_pos: list[int] = []
        for tr in traces:
            for c in tr.chunks:
                if c.num_spec_tokens:
                    drafts += 1
                    proposed += c.num_spec_tokens
                    accepted += c.num_accepted_tokens
                    if len(per_pos) < c.num_spec_tokens:
                        per_pos += [0] * (c.num_spec_tokens - len(per_pos))
                    for i in range(c.num_accepted_tokens):
                        per_pos[i] += 1
        return cls(drafts, proposed, accepted, tuple(per_pos))


def accepted_prefix(proposals: list[int], verified: list[int]) -> int:
    """How many leading proposals equal the target model's tokens at the same positions (``verified[i]`` is
    the model's token for the position of ``proposals[i]``): the length of the longest common prefix."""
    n = 0
    for p, v in zip(proposals, verified):
        if p != v:
            break
        n += 1
    return n
