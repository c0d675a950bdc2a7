"""The speculative-decoding door (``speculative_config``): a decode carries up to k proposed tokens.

``core/spec_decode.py`` holds the proposer and the idea's sources. Here: ``Speculation`` (step-builder mixin)
schedules ``[latest token] + proposals`` for a running decode when the budget and FREE blocks allow, and
``SpeculativeScheduling`` (scheduler mixin) commits what the sampler verified: the accepted proposals plus one
token of the sampler's own, ``num_computed_tokens`` advanced by that count (the K/V of the accepted proposals was
written by the verifying forward); the blocks past them held only rejected proposals and are freed at once.
"""

from __future__ import annotations

import dataclasses

from minengine.core.kv_cache_manager import cdiv
from minengine.core.scheduler_output import ScheduledRequest
from minengine.core.spec_decode import NgramProposer
from minengine.request import Request, RequestStatus


class SpeculativeScheduling:
    """Scheduler mixin: owns the proposer and commits verified proposals."""

    @staticmethod
    def open_door(scheduler, speculative_config=None, **_) -> None:
        scheduler.speculative_config = speculative_config
        scheduler.proposer = NgramProposer(speculative_config)

    def new_step(self, out=None):
        step = super().new_step(out)
        step.proposer = self.proposer
        return step

    def commit_sampled(self, request: Request, s: ScheduledRequest, tokens: list[int]) -> RequestStatus | None:
        """``tokens`` = the accepted proposals + the sampler's own token; appended one at a time, each checked
        for a stop (the rest of the list is dropped)."""
        if not s.spec_token_ids:
            return super().commit_sampled(request, s, tokens)
        request.num_computed_tokens += len(tokens)
        self.kv.truncate(request, cdiv(request.num_computed_tokens, self.kv.block_size))
        for token in tokens:
            status = self.append_token(request, token)
            if status is not None:
                return status
        return None


class Speculation:
    """Step-builder mixin: proposals for running decodes, within the budget and the free blocks."""

    proposer: NgramProposer  # set by ``SpeculativeScheduling.new_step``

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._spec: dict[str, list[int]] = {}  # request id -> its proposals in this step

    def run(self, request: Request, limit: int | None = None) -> int:
        limit = self.budget if limit is None else min(limit, self.budget)
        if limit > 0 and request.is_decode:
            undo = self._undo_running(request)  # before ``_speculate`` allocates
            spec = self._speculate(request, limit)
            if spec:
                self._spec[request.request_id] = spec
                self.schedule_chunk(request, 1 + len(spec), undo)
                return 1 + len(spec)
        return super().run(request, limit)

    def _speculate(self, request: Request, limit: int) -> list[int]:
        """Proposals for a decode (``core/spec_decode.py``) and their KV slots, or [] (then it decodes plainly).

        At most what the step's ``limit`` leaves beside the decode's own token, and never more than the request
        may still generate (``max_tokens``, ``max_model_len``: the verified step appends up to 1 + proposals).
        Speculation uses only FREE blocks that nobody else in the step may need: the proposals are cut to the
        slots of the request's own blocks plus the free blocks beyond one for every other running request not
        yet scheduled in this step (what its next decode token may need), so proposals never preempt anybody,
        directly or by leaving a later decode of the same step without a block (vLLM v1 would preempt for
        them). Under memory pressure a request therefore speculates only within the blocks it holds."""
        bs = self.kv.block_size
        room = min(limit, self.config.max_model_len - request.num_tokens,
                   request.sampling_params.max_tokens - request.num_output_tokens) - 1
        if room <= 0:
            return []
        held = len(self.kv.req_to_blocks.get(request.request_id, ()))
        others = len(self.running) - len(self._num_new) - 1  # running, not scheduled yet, not this request
        free = max(0, self.kv.num_free_blocks - max(0, others))
        room = min(room, (held + free) * bs - request.num_computed_tokens - 1)
        spec = self.proposer.propose(request, room) if room > 0 else []
        if spec and self.kv.allocate_slots(request, 1 + len(spec)) is None:
            raise RuntimeError("speculative allocation failed after the free-block check")  # a bug guard
        return spec

    def known_end(self, request: Request, num_new: int) -> int:
        """A block holding a proposal is never staged (it may be rejected)."""
        return super().known_end(request, num_new) - len(self._spec.get(request.request_id, ()))

    def scheduled_request(self, request: Request, num_new: int) -> ScheduledRequest:
        """A decode verifying proposals: its latest token, then the proposals."""
        spec = self._spec.get(request.request_id)
        if not spec:
            return super().scheduled_request(request, num_new)
        decode = super().scheduled_request(request, num_new - len(spec))
        self.out.num_spec_tokens += len(spec)
        return dataclasses.replace(decode, token_ids=decode.token_ids + spec, spec_token_ids=spec)
