"""A step's logprobs as the positions a ``CompletionOutput`` carries (vLLM's ``{token id: Logprob}`` per
position), for the requests that asked for ``logprobs`` or ``prompt_logprobs``: ``OutputProcessor`` calls it
only for those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minengine.exceptions import RequestError
from minengine.outputs import Logprob, PositionLogprobs

if TYPE_CHECKING:  # the sampler imports torch; an engine on a model-free runner (minengine.fleet) runs without it
    from minengine.worker.token_logprobs import TokenLogprobs


@dataclass
class LogprobsPositions:
    """Builds positions from the sampler's ``TokenLogprobs``. ``tokenizer`` (or None) decodes each token once
    (``Logprob.decoded_token``; None without a tokenizer)."""

    tokenizer: object = None
    _decoded: dict[int, str] = field(default_factory=dict)

    def of_request(self, sampled: list[TokenLogprobs] | None, prompt_kept: int | None,
                   prompt: tuple[int, list[TokenLogprobs]] | None) -> tuple[list[PositionLogprobs], float, list]:
        """One request's positions of a step: ``(positions of its new tokens, their summed logprob, positions of
        the prompt tokens not kept yet)``.

        Args:
            sampled: its new tokens' logprobs, or None when it did not ask for ``logprobs``.
            prompt_kept: how many prompt positions it keeps already, or None without ``prompt_logprobs``.
            prompt: (first prompt index, logprobs) of the prompt tokens its chunks scored, or None. A re-prefill
                after a recompute preemption scores them again: each is kept once.
        """
        positions, total = [], 0.0
        for lp in sampled or ():
            positions.append(self.position(lp))
            total += lp.logprobs[0]
        new_prompt = []
        if prompt_kept is not None and prompt is not None:
            start, scored = prompt
            for i, lp in enumerate(scored, start):
                if i == prompt_kept + len(new_prompt):  # the next position not yet kept
                    new_prompt.append(self.position(lp))
        return positions, total, new_prompt

    def position(self, lp: TokenLogprobs) -> PositionLogprobs:
        """One position: {token id: ``Logprob``}, the sampled token first (its first entry wins)."""
        out: PositionLogprobs = {}
        for tid, value, rank in zip(lp.token_ids, lp.logprobs, lp.ranks):
            if tid not in out:
                out[tid] = Logprob(logprob=value, rank=rank, decoded_token=self._decode(tid))
        return out

    def _decode(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        if token_id not in self._decoded:
            self._decoded[token_id] = self.tokenizer.decode([token_id])
        return self._decoded[token_id]


def prepare_logprobs(processor, sampled: dict[str, list[TokenLogprobs]],
                     prompt: dict[str, tuple[int, list[TokenLogprobs]]]) -> dict[str, tuple]:
    """A step's logprobs as positions for ``processor`` (the ``OutputProcessor``), changing nothing (the step may
    still fail): of the tokens each request got (one, or several with speculative decoding), and of the prompt
    tokens its chunks scored (``LogprobsPositions.of_request``). ``record_logprobs`` stores them.

    Raises:
        RequestError: building one request's positions failed (decoding its tokens); names that request.
    """
    out: dict[str, tuple] = {}
    for rid in set(sampled) | set(prompt):
        state = processor.states.get(rid)
        if state is None:
            continue
        try:
            out[rid] = processor.logprobs_positions.of_request(
                sampled.get(rid, ()) if state.logprobs is not None else None,
                len(state.prompt_logprobs) if state.prompt_logprobs is not None else None, prompt.get(rid))
        except Exception as exc:
            raise RequestError([processor.caller_id(rid)], f"logprobs of request {rid!r} failed: {exc!r}") from exc
    return out

def record_logprobs(processor, prepared: dict[str, tuple]) -> None:
    """Store what ``prepare_logprobs`` built (after the step committed; plain appends, nothing can fail)."""
    for rid, (positions, total, new_prompt) in prepared.items():
        state = processor.states[rid]
        if state.logprobs is not None:
            state.logprobs.extend(positions)
            state.cumulative_logprob += total
        if state.prompt_logprobs is not None:
            state.prompt_logprobs.extend(new_prompt)
