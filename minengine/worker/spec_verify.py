"""The sampler's speculative-decoding door: verify a decode's k proposals row by row (see ``Sampler``)."""

from __future__ import annotations

import torch

from minengine.core.scheduler_output import ScheduledRequest
from minengine.worker.structured_sampling import sample_structured


def verify_proposals(sampler, work: torch.Tensor, raw: torch.Tensor, argmax: list[int], first_row: int,
                     s: ScheduledRequest) -> list[int]:
    """Accepted proposals of ``s`` plus one token of the sampler's own (see ``Sampler``'s docstring)."""
    spec, out, so = s.spec_token_ids, [], s.structured_output
    advanced = 0
    try:
        for i in range(len(spec) + 1):
            row = first_row + i
            if so is not None:
                token = sample_structured(sampler, work, raw, row, s, i)
            elif not s.sampling_params.needs_processing(s.output_index + i):
                token = argmax[row]
            else:
                token = sampler.sample_row(work[row], s, i)
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
