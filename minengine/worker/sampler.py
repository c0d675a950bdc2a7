"""Sampler: the logits of the sampling rows -> token ids, greedy or drawn with per-request seeds.

The default row is an argmax (greedy, no penalties or masks). A row whose request needs more goes through
``worker/logits_processing.py`` (vLLM v1's order: token masks, ``min_tokens``, penalties, then temperature, min-p)
and is drawn; with top-k or top-p through ``worker/top_k_top_p.py`` (without sorting the vocabulary). Doors, each
in its own file: a structured-output request's grammar bitmask (``worker/structured_sampling.py``; applied first,
so raw logprobs are those of the constrained distribution), speculative proposals verified row by row
(``worker/spec_verify.py``), logprobs (``worker/token_logprobs.py``), and custom logits processors
(``worker/logits_processors.py``), which run on the whole batch before the per-request steps (vLLM runs them after
the token masks, ``min_tokens`` and ``logit_bias``, and argmax-invariant ones after the temperature: the same
result for processors that only mask tokens or keep chosen tokens' values).

A seeded request draws each token from a generator seeded by (seed, index of the token), so its output
does not depend on the other requests in the batch, on chunking or on preemption.
"""

from __future__ import annotations

import torch

from minengine.core.scheduler_output import ScheduledRequest
from minengine.worker.logits_processing import scaled_logits
from minengine.worker.spec_verify import verify_proposals
from minengine.worker.structured_sampling import sample_structured
from minengine.worker.token_logprobs import TokenLogprobs, sampled_logprobs
from minengine.worker.top_k_top_p import sample_top_k_top_p

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, index) pairs over the seed space


def token_generator(seed: int, output_index: int) -> torch.Generator:
    """A CPU generator for the ``output_index``-th token of a request seeded with ``seed``."""
    return torch.Generator().manual_seed((seed * _MIX + output_index) % (2**63 - 1))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` ([R, V] -> [R] int64) at the speed of a max (torch's CPU argmax is several times slower):
    the first block of 64 logits holding each row's max (its first index, a NaN counting as the max, as in
    ``torch.argmax``), then the max inside it. Fewer than 65,536 logits, or V not a multiple of 64: torch.argmax."""
    rows, vocab = logits.shape
    if vocab % 64 or rows * vocab < 65536:
        return logits.argmax(-1)
    blocks = logits.contiguous().view(rows, vocab // 64, 64)
    best = blocks.amax(-1).argmax(-1)  # [R]: the first block holding the row's max
    return best * 64 + blocks[torch.arange(rows), best].argmax(-1)


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
        self.bitmask: torch.Tensor | None = None  # one row, reused: [1, ceil(V / 32)] int32

    def __call__(self, logits: torch.Tensor, requests: list[ScheduledRequest]) -> list[list[int]]:
        """logits: [R, V] float32, ``num_sampled`` rows per request (one, or k + 1 with k proposals), in
        ``requests`` order -> per request the tokens it gets this step (1 to k + 1). The rows of
        structured-output requests are masked in place (float32 CPU logits are not copied first)."""
        logits = logits.float().cpu()
        # Custom logits processors edit a copy: raw logprobs are read from ``logits`` (as vLLM's).
        work = logits if self.logits_processors is None else self.logits_processors.apply(logits.clone(), requests)
        argmax = argmax_rows(work).tolist()  # greedy requests without processing keep these
        if len(argmax) == len(requests):  # no proposals in the step: one row per request
            tokens = [[t] for t in argmax]
            rows = list(range(len(requests)))
            for row, s in enumerate(requests):
                if s.structured_output is not None:
                    tokens[row][0] = sample_structured(self, work, logits, row, s, 0)
                elif s.sampling_params.needs_processing(s.output_index):
                    tokens[row][0] = self.sample_row(work[row], s, 0)
        else:
            tokens, rows, row = [], [], 0
            for s in requests:
                rows.append(row)
                tokens.append(verify_proposals(self, work, logits, argmax, row, s))
                row += 1 + len(s.spec_token_ids)
        self.last_logprobs = {}
        want = [i for i, s in enumerate(requests) if s.sampling_params.logprobs is not None]
        if want:
            self.last_logprobs = sampled_logprobs(logits, requests, tokens, rows, want)
        return tokens

    def sample_row(self, row_logits: torch.Tensor, s: ScheduledRequest, offset: int) -> int:
        """The token of ``s`` at ``offset`` positions after its first sampled one (the proposals before it
        counting as generated), as a non-speculative step there would sample it."""
        p = s.sampling_params
        index = s.output_index + offset
        if not p.needs_processing(index):
            return int(row_logits.argmax())
        outputs = s.output_token_ids[:s.output_index]
        if offset:
            outputs = list(outputs) + list(s.spec_token_ids[:offset])
        x = scaled_logits(row_logits, p, s.prompt_token_ids, outputs)
        if p.greedy:
            return int(x.argmax())
        gen = self.generator if p.seed is None else token_generator(p.seed, index)
        if 0 < p.top_k < x.shape[-1] or p.top_p < 1.0:  # k >= V keeps all; no full sort: worker/top_k_top_p.py
            return sample_top_k_top_p(x, p.top_k, p.top_p, gen)
        return int(torch.multinomial(x.softmax(-1), 1, generator=gen).item())
