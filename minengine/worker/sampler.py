"""Sampler: grammar masks, logprobs, token masks, logits processors, min_tokens, penalties, greedy /
temperature / min-p / top-k / top-p, per-request seeds.

The order follows vLLM v1: a structured-output request's grammar bitmask first (``worker/structured_output.py``;
vLLM applies it to the logits before its sampler, so raw logprobs are those of the constrained distribution);
raw logprobs; ``allowed_token_ids``, ``bad_words`` and ``logit_bias``; ``min_tokens`` masks EOS and the stop
token ids; the penalties (repetition, then frequency and presence); a greedy request takes the argmax of that;
the others divide by the temperature, apply min-p, top-k and top-p, and draw. Custom logits processors
(``worker/logits_processors.py``) run on the whole batch before all the per-request steps (vLLM runs them after
the token masks, ``min_tokens`` and ``logit_bias``, and argmax-invariant ones after the temperature): the same
result for processors that only mask tokens or keep chosen tokens' values. A request without any of these
features costs what it cost before they existed: the per-request check that sends a row through processing
reads one more attribute.

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


def apply_token_masks(logits: torch.Tensor, params: SamplingParams, output_ids: Sequence[int]) -> torch.Tensor:
    """``allowed_token_ids``, ``bad_words`` and ``logit_bias`` of one request, in vLLM's order.

    A bad word of tokens ``w`` is masked at its last token whenever the output ends with ``w[:-1]`` (a
    one-token word always); the logit bias is added to the logits.

    Args:
        logits: [V] float32. output_ids: the request's generated tokens so far.
    Returns:
        [V] float32 (a new tensor).
    """
    vocab = logits.shape[-1]
    if params.allowed_token_ids:
        keep = torch.tensor(params.allowed_token_ids, dtype=torch.long)
        out = torch.full_like(logits, float("-inf"))
        out[keep] = logits[keep]
        logits = out
    else:
        logits = logits.clone()
    if params.bad_words_token_ids:
        n = len(output_ids)
        banned = [w[-1] for w in params.bad_words_token_ids
                  if len(w) <= n + 1 and (len(w) == 1 or list(output_ids[n - len(w) + 1:]) == list(w[:-1]))]
        if banned:
            logits[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        ok = ids < vocab
        logits[ids[ok]] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype)[ok]
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
    if params.has_token_masks:
        logits = apply_token_masks(logits, params, output_ids)
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
    return (not p.greedy or p.has_penalties or (output_index < p.min_tokens and bool(p.all_stop_token_ids))
            or p.has_token_masks)


def _masked_row(work: torch.Tensor, raw: torch.Tensor, row: int, so, bitmask: torch.Tensor) -> bool:
    """Apply the grammar state ``so``'s mask to row ``row`` of ``work`` (and of ``raw``, the logprobs' logits,
    when it is another tensor), in place; False when the mask allows no token (a dead end of the grammar for
    this vocabulary)."""
    from minengine.worker.structured_output import apply_bitmask

    so.fill_bitmask(bitmask, 0)
    if not bool(bitmask.any()):
        return False
    apply_bitmask(work[row:row + 1], bitmask, [0])
    if raw is not work:
        apply_bitmask(raw[row:row + 1], bitmask, [0])
    return True


class Sampler:
    """Turns the logits of the sampling requests into token ids (and logprobs where asked), and verifies
    speculative proposals.

    A request without proposals has one row and gets one token. A request verifying k proposals
    (``ScheduledRequest.spec_token_ids``) has k + 1 rows, row i holding the logits after its first i proposals.
    Row by row, the sampler takes the token it would have taken without speculation at that position (argmax
    for greedy; for the others a draw from the processed distribution, with the same per-token generator
    ``(seed, output_index + i)`` as without speculation, and penalties and ``min_tokens`` counting the proposals
    before row i as generated), and goes on while that token equals the proposal. So the request gets the
    accepted proposals plus one token of the sampler's own (the correction at the first mismatch, or the bonus
    token after k accepted ones), exactly the tokens it would have generated one step at a time: token-identical
    under greedy and under seeded sampling. For a draft that proposes one token with certainty this is the
    rejection sampling of speculative sampling (Leviathan et al., ICML 2023, section 2.3; Chen et al. 2023,
    algorithm 2): the proposal is kept with probability p(proposal) = min(1, p / q) for q = 1, and a rejection
    draws from the residual ``norm(max(0, p - q))``, which is p without the proposal, as the draw does here.

    Structured outputs: a request with a grammar state (``ScheduledRequest.structured_output``) has each of its
    rows masked by that state before it is sampled; when verifying proposals, row i is masked by the state after
    the first i proposals (the sampler advances the state through the proposals it accepts and rolls it back
    before returning: only ``Scheduler.update_from_output`` commits). A proposal the grammar rejects is never
    accepted, since the token sampled at its row is always one the grammar allows; and a run of accepted
    proposals ends at the one that completes the grammar.

    Args:
        seed: seeds the shared generator used by requests without their own seed.
        logits_processors: the engine's custom logits processors (``CustomLogitsProcessors``) or None.

    Attributes:
        last_logprobs: {request_id: [TokenLogprobs of each token it got]} of the last call, for the requests
            with ``logprobs`` set.
    """

    def __init__(self, seed: int = 0, logits_processors=None):
        self.generator = torch.Generator().manual_seed(seed)
        self.last_logprobs: dict[str, list[TokenLogprobs]] = {}
        self.logits_processors = logits_processors
        self._bitmask: torch.Tensor | None = None  # one row, reused: [1, ceil(V / 32)] int32

    def __call__(self, logits: torch.Tensor, requests: list[ScheduledRequest]) -> list[list[int]]:
        """logits: [R, V] float32, ``num_sampled`` rows per request (one, or k + 1 with k proposals), in
        ``requests`` order -> per request the tokens it gets this step (1 to k + 1). The rows of
        structured-output requests are masked in place (float32 CPU logits are not copied first)."""
        logits = logits.float().cpu()
        # Custom logits processors edit a copy: raw logprobs are read from ``logits`` (as vLLM's).
        work = logits if self.logits_processors is None else self.logits_processors.apply(logits.clone(), requests)
        argmax = work.argmax(-1).tolist()  # greedy requests without processing keep these
        if len(argmax) == len(requests):  # no proposals in the step: one row per request
            tokens = [[t] for t in argmax]
            rows = list(range(len(requests)))
            for row, s in enumerate(requests):
                if s.structured_output is not None:
                    tokens[row][0] = self._sample_structured(work, logits, row, s, 0)
                elif _needs_processing(s.sampling_params, s.output_index):
                    tokens[row][0] = self._sample(work[row], s, 0)
        else:
            tokens, rows, row = [], [], 0
            for s in requests:
                rows.append(row)
                tokens.append(self._verify(work, logits, argmax, row, s))
                row += 1 + len(s.spec_token_ids)
        self.last_logprobs = {}
        want = [i for i, s in enumerate(requests) if s.sampling_params.logprobs is not None]
        if want:
            self._logprobs(logits, requests, tokens, rows, want)
        return tokens

    def _sample(self, row_logits: torch.Tensor, s: ScheduledRequest, offset: int) -> int:
        """The token of ``s`` at ``offset`` positions after its first sampled one (the proposals before it
        counting as generated), as a non-speculative step there would sample it."""
        p = s.sampling_params
        index = s.output_index + offset
        if not _needs_processing(p, index):
            return int(row_logits.argmax())
        outputs = s.output_token_ids[:s.output_index]
        if offset:
            outputs = list(outputs) + list(s.spec_token_ids[:offset])
        x = process_logits(row_logits, p, s.prompt_token_ids, outputs)
        if p.greedy:
            return int(x.argmax())
        gen = self.generator if p.seed is None else token_generator(p.seed, index)
        return int(torch.multinomial(x.softmax(-1), 1, generator=gen).item())

    def _sample_structured(self, work: torch.Tensor, raw: torch.Tensor, row: int, s: ScheduledRequest,
                           offset: int) -> int:
        """The token of a structured-output request at ``row``: masked by its grammar state, then sampled as any
        other. A dead end (no token allowed) gives the request's first stop token, which the grammar rejects:
        ``update_from_output`` then finishes the request with "abort" instead of appending it."""
        if self._bitmask is None or self._bitmask.shape[1] != -(-work.shape[1] // 32):
            from minengine.worker.structured_output import new_bitmask

            self._bitmask = new_bitmask(1, work.shape[1])
        if not _masked_row(work, raw, row, s.structured_output, self._bitmask):
            stops = s.sampling_params.all_stop_token_ids
            return min(stops) if stops else 0
        return self._sample(work[row], s, offset)

    def _verify(self, work: torch.Tensor, raw: torch.Tensor, argmax: list[int], first_row: int,
                s: ScheduledRequest) -> list[int]:
        """Accepted proposals of ``s`` plus one token of the sampler's own (see the class docstring)."""
        spec, out, so = s.spec_token_ids, [], s.structured_output
        advanced = 0
        try:
            for i in range(len(spec) + 1):
                row = first_row + i
                if so is not None:
                    token = self._sample_structured(work, raw, row, s, i)
                elif not _needs_processing(s.sampling_params, s.output_index + i):
                    token = argmax[row]
                else:
                    token = self._sample(work[row], s, i)
                out.append(token)
                if i == len(spec) or token != spec[i]:
                    break
                if so is not None:  # row i + 1 is masked by the state after this accepted proposal
                    if not so.speculate(token):
                        break
                    advanced += 1
                    if so.is_terminated():  # the output is complete: nothing after it is kept
                        break
        finally:
            if so is not None:
                so.rollback(advanced)
        return out

    def _logprobs(self, logits, requests, tokens, rows, want) -> None:
        """Raw logprobs of every token the requests in ``want`` got (one position per token)."""
        flat_rows = [rows[i] + j for i in want for j in range(len(tokens[i]))]
        chosen = [t for i in want for t in tokens[i]]
        owner = [i for i in want for _ in tokens[i]]
        raw = torch.log_softmax(logits[flat_rows], dim=-1)
        for k in {requests[i].sampling_params.logprobs for i in want}:
            sel = [j for j, i in enumerate(owner) if requests[i].sampling_params.logprobs == k]
            lps = position_logprobs(raw[sel], torch.tensor([chosen[j] for j in sel], dtype=torch.long), k)
            for j, lp in zip(sel, lps):
                self.last_logprobs.setdefault(requests[owner[j]].request_id, []).append(lp)


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
