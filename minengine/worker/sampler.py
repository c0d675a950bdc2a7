"""Sampler: logprobs, min_tokens, penalties, greedy / temperature / min-p / top-k / top-p, per-request seeds.

The order is vLLM v1's: raw logprobs first (the model's own distribution); then ``min_tokens`` masks EOS and
the stop token ids; then the penalties (repetition, then frequency and presence); a greedy request takes the
argmax of that; the others divide by the temperature, apply min-p, top-k and top-p, and draw.

A seeded request draws each token from a generator seeded by (seed, index of the token), so its output
does not depend on the other requests in the batch, on chunking or on preemption.
Sources: top-p is nucleus sampling (Holtzman et al., ICLR 2020); min-p (Nguyen et al., 2024); the repetition
penalty from CTRL (Keskar et al., 2019); presence and frequency penalties as OpenAI's API defines them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from minengine.core.scheduler_output import ScheduledRequest
from minengine.sampling_params import SamplingParams

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, index) pairs over the seed space


def token_generator(seed: int, output_index: int) -> torch.Generator:
    """A CPU generator for the ``output_index``-th token of a request seeded with ``seed``."""
    return torch.Generator().manual_seed((seed * _MIX + output_index) % (2**63 - 1))


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probabilities at one position: the chosen (sampled, or next prompt) token first, then the top-k.

    ``token_ids[i]`` has natural-log probability ``logprobs[i]`` and ``ranks[i]`` (1 = most likely; the
    number of tokens at least as likely). The chosen token may appear again among the top-k.
    """

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


def position_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, k: int) -> list[TokenLogprobs]:
    """Chosen-token and top-k log-probabilities of many positions.

    Args:
        logprobs: [P, V] float32 log-softmax of the raw logits. chosen: [P] int64 token ids. k: top-k (>= 0).
    Returns:
        P ``TokenLogprobs``.
    """
    chosen_lp = logprobs.gather(1, chosen[:, None])  # [P, 1]
    ranks = (logprobs >= chosen_lp).sum(-1)  # vLLM's rank: tokens at least as likely, itself included
    top_lp, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], chosen[:, None][:, :0])
    out = []
    for i in range(logprobs.shape[0]):
        out.append(TokenLogprobs(token_ids=[int(chosen[i])] + top_ids[i].tolist(),
                                 logprobs=[float(chosen_lp[i, 0])] + top_lp[i].tolist(),
                                 ranks=[int(ranks[i])] + list(range(1, k + 1))))
    return out


def finite_overflow(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y`` (computed elementwise from ``x``) with float32 overflow clamped to the largest finite value where
    ``x`` was finite: a logit divided by a tiny repetition penalty or temperature, or multiplied by a huge
    penalty, would become +-inf, and softmax over +inf is NaN. Where ``x`` is -inf (a masked token) it stays
    -inf (-inf times a penalty that rounds to 0 in float32 would be NaN)."""
    big = torch.finfo(y.dtype).max
    return torch.where(torch.isfinite(x), y.clamp(-big, big), x)


def apply_penalties(logits: torch.Tensor, prompt_ids: Sequence[int], output_ids: Sequence[int],
                    params: SamplingParams) -> torch.Tensor:
    """Repetition penalty over prompt + output tokens, then frequency and presence penalties over the output.

    Args:
        logits: [V] float32 raw logits. prompt_ids, output_ids: the request's tokens so far.
    Returns:
        [V] float32 (a new tensor).
    """
    logits = logits.clone()
    vocab = logits.shape[-1]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(list(prompt_ids) + list(output_ids), dtype=torch.long).unique()
        seen = seen[seen < vocab]
        x = logits[seen]
        logits[seen] = finite_overflow(torch.where(x > 0, x / params.repetition_penalty,
                                                   x * params.repetition_penalty), x)
    if output_ids and (params.frequency_penalty or params.presence_penalty):
        ids = torch.tensor(list(output_ids), dtype=torch.long)
        counts = torch.bincount(ids[ids < vocab], minlength=vocab).to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Mask to -inf tokens whose probability is below ``min_p`` x the top probability. logits: [V] float32."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask to -inf every logit outside the top-k and outside the top-p nucleus.

    Args:
        logits: [V] float32 (already divided by the temperature).
        top_k: keep the k largest (0 or -1 keeps all). top_p: keep the smallest prefix of the sorted
            distribution whose probability reaches top_p (1.0 keeps all); the most likely token always stays.
    Returns:
        [V] float32.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens strictly before it already reach top_p.
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def process_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                   output_ids: Sequence[int]) -> torch.Tensor:
    """Everything between the raw logits and the draw, for one request: min_tokens, penalties, then (not for
    greedy requests) temperature, min-p, top-k and top-p. ``softmax`` of the result is the distribution the
    token is drawn from (greedy takes its argmax).

    Args:
        logits: [V] float32 raw logits of the position being sampled.
        params: the request's settings (``all_stop_token_ids`` filled by the engine).
        prompt_ids, output_ids: the request's tokens so far (``len(output_ids)`` tokens generated).
    Returns:
        [V] float32.
    """
    if len(output_ids) < params.min_tokens and params.all_stop_token_ids:
        logits = logits.clone()
        stop = torch.tensor(sorted(params.all_stop_token_ids), dtype=torch.long)
        logits[stop[stop < logits.shape[-1]]] = float("-inf")
    if params.has_penalties:
        logits = apply_penalties(logits, prompt_ids, output_ids, params)
    if params.greedy:
        return logits
    logits = apply_min_p(finite_overflow(logits / params.temperature, logits), params.min_p)
    return apply_top_k_top_p(logits, params.top_k, params.top_p)


def _needs_processing(p: SamplingParams, output_index: int) -> bool:
    return not p.greedy or p.has_penalties or (output_index < p.min_tokens and bool(p.all_stop_token_ids))


class Sampler:
    """Turns the logits of the sampling requests into token ids (and logprobs where asked).

    Args:
        seed: seeds the shared generator used by requests without their own seed.

    Attributes:
        last_logprobs: {request_id: TokenLogprobs of the sampled token} of the last call, for the requests
            with ``logprobs`` set.
    """

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)
        self.last_logprobs: dict[str, TokenLogprobs] = {}

    def __call__(self, logits: torch.Tensor, requests: list[ScheduledRequest]) -> list[int]:
        """logits: [S, V] float32, one row per sampling request, in ``requests`` order -> S token ids."""
        logits = logits.float().cpu()
        tokens = logits.argmax(-1).tolist()  # greedy requests without penalties keep these
        for row, s in enumerate(requests):
            p = s.sampling_params
            if not _needs_processing(p, s.output_index):
                continue
            x = process_logits(logits[row], p, s.prompt_token_ids, s.output_token_ids[:s.output_index])
            if p.greedy:
                tokens[row] = int(x.argmax())
                continue
            gen = self.generator if p.seed is None else token_generator(p.seed, s.output_index)
            tokens[row] = int(torch.multinomial(x.softmax(-1), 1, generator=gen).item())
        self.last_logprobs = {}
        want = [row for row, s in enumerate(requests) if s.sampling_params.logprobs is not None]
        if want:
            raw = torch.log_softmax(logits[want], dim=-1)
            for k in {requests[row].sampling_params.logprobs for row in want}:
                rows = [i for i, row in enumerate(want) if requests[row].sampling_params.logprobs == k]
                chosen = torch.tensor([tokens[want[i]] for i in rows], dtype=torch.long)
                for i, lp in zip(rows, position_logprobs(raw[rows], chosen, k)):
                    self.last_logprobs[requests[want[i]].request_id] = lp
        return tokens


def compute_prompt_logprobs(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                            row_starts: Sequence[int],
                            scheduled: list[ScheduledRequest]) -> dict[str, tuple[int, list[TokenLogprobs]]]:
    """Log-probabilities of the prompt tokens a step's prefill chunks predict, for requests that asked.

    The hidden state at position p predicts token p + 1, so a chunk covering positions [start, end) of a
    prompt of P tokens scores prompt tokens start + 1 .. min(end, P - 1) (the first prompt token has none).

    Args:
        compute_logits: the model's LM head, [N, hidden] -> [N, V] float32.
        hidden: [T, hidden], the step's final hidden states.
        row_starts: per scheduled request (scheduler order), the row of ``hidden`` holding its first new token
            (its new tokens are the rows after it).
        scheduled: the step's requests, in the scheduler's order.
    Returns:
        {request_id: (index of the first prompt token scored, one ``TokenLogprobs`` per scored token)}.
    """
    out = {}
    for i, s in enumerate(scheduled):
        k = s.sampling_params.prompt_logprobs
        num_prompt = len(s.prompt_token_ids)
        last = min(s.seq_len, num_prompt - 1)  # exclusive end of the predicting positions
        if k is None or s.start_pos >= last:
            continue
        rows = hidden[row_starts[i]:row_starts[i] + last - s.start_pos]
        logprobs = torch.log_softmax(compute_logits(rows).float().cpu(), dim=-1)
        targets = torch.tensor(s.prompt_token_ids[s.start_pos + 1:last + 1], dtype=torch.long)
        out[s.request_id] = (s.start_pos + 1, position_logprobs(logprobs, targets, k))
    return out
