"""Log-probabilities: of the sampled tokens (vLLM's ``logprobs``) and of the prompt tokens (``prompt_logprobs``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from minengine.core.scheduler_output import ScheduledRequest


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


def sampled_logprobs(logits, requests, tokens, rows, want) -> dict[str, list[TokenLogprobs]]:
    """Raw logprobs of every token the requests in ``want`` (indices into ``requests``) got, one position per token:
    {request_id: [TokenLogprobs]}. ``logits``: [R, V] float32 raw logits; ``rows[i]``: request i's first row."""
    out: dict[str, list[TokenLogprobs]] = {}
    flat_rows = [rows[i] + j for i in want for j in range(len(tokens[i]))]
    chosen = [t for i in want for t in tokens[i]]
    owner = [i for i in want for _ in tokens[i]]
    raw = torch.log_softmax(logits[flat_rows], dim=-1)
    for k in {requests[i].sampling_params.logprobs for i in want}:
        sel = [j for j, i in enumerate(owner) if requests[i].sampling_params.logprobs == k]
        lps = position_logprobs(raw[sel], torch.tensor([chosen[j] for j in sel], dtype=torch.long), k)
        for j, lp in zip(sel, lps):
            out.setdefault(requests[owner[j]].request_id, []).append(lp)
    return out


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
