"""vLLM 0.33's ``vllm.logprobs`` path: ``Logprob`` and the names of its per-position containers.

A position's logprobs are ``{token id: Logprob}`` (the sampled or prompt token first, then the most likely by
rank); a request's sampled logprobs are one such dict per output token, its prompt logprobs one per prompt token
with ``None`` for the first (it has no context to be predicted from). Defined in ``minengine.outputs``.
"""

from __future__ import annotations

from minengine.outputs import Logprob, PositionLogprobs

LogprobsOnePosition = PositionLogprobs
SampleLogprobs = list[PositionLogprobs]
PromptLogprobs = list[PositionLogprobs | None]

__all__ = ["Logprob", "LogprobsOnePosition", "PromptLogprobs", "SampleLogprobs"]
