"""What the driver sends the workers each step, and what each worker answers.

A ``SchedulerOutput`` holds, per scheduled request, its ``SamplingParams`` and references to its prompt and
output token lists. Pickled as it is, 256 decodes took ~1.5 ms to pickle and ~2 ms to unpickle per step on this
project's CPU machine, mostly the ``SamplingParams`` objects; as plain tuples ~0.25 and ~0.35 ms. So the
``StepEncoder`` sends a request's ``SamplingParams`` (and its prompt, when the sampler reads it: penalties,
prompt logprobs) once, the first time the workers see the request, its output tokens only when the sampler
reads them (penalties, ``min_tokens``), and everything else of the step (new tokens, positions, block tables)
every step; the ``StepDecoder`` in each worker rebuilds the ``SchedulerOutput`` from its cache. vLLM's
``NewRequestData`` / ``CachedRequestData`` do the same. The encoder decides what the workers cache and tells
them what to forget, so the two caches are always the same.

Async scheduling: the decoder also fills the placeholders (``PLACEHOLDER_TOKEN_ID``) of a decode scheduled
while the step before it ran, with the token this worker sampled for it in that step (every rank runs the same
sampler on the same all-reduced logits, so all ranks have the same tokens; the driver checks it every step).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field

from minengine.core.scheduler_output import PLACEHOLDER_TOKEN_ID, ScheduledRequest, SchedulerOutput
from minengine.sampling_params import SamplingParams

# The encoder forgets the requests not in a step once it knows more than this many (and 4x the step's).
MAX_KNOWN_REQUESTS = 1024


def _reads_prompt(p: SamplingParams) -> bool:
    return p.has_penalties or p.prompt_logprobs is not None


def _reads_outputs(p: SamplingParams) -> bool:
    return p.has_penalties or p.min_tokens > 0


class StepEncoder:
    """Driver side: ``SchedulerOutput`` -> bytes, numbering the steps 0, 1, 2, ..."""

    def __init__(self):
        self._known: dict[str, tuple[SamplingParams, Sequence[int]]] = {}  # what every worker has cached
        self.num_steps = 0

    def encode(self, scheduler_output: SchedulerOutput) -> tuple[int, bytes]:
        """(step id, the message for every worker)."""
        known, new, requests = self._known, {}, []
        for s in scheduler_output.scheduled:
            p, rid = s.sampling_params, s.request_id
            entry = known.get(rid)
            if entry is None or entry[0] is not p or entry[1] is not s.prompt_token_ids:  # new, or an id reused
                new[rid] = (p, list(s.prompt_token_ids) if _reads_prompt(p) else ())
                known[rid] = (p, s.prompt_token_ids)
            outputs = list(s.output_token_ids) if _reads_outputs(p) else None
            requests.append((rid, s.token_ids, s.start_pos, s.block_ids, s.sample, s.is_prefill, s.output_index,
                             tuple(s.spec_token_ids), outputs))
        forget = []
        if len(known) > max(MAX_KNOWN_REQUESTS, 4 * len(requests)):  # amortised O(1): finished requests go
            in_step = {r[0] for r in requests}
            forget = [rid for rid in known if rid not in in_step]
            for rid in forget:
                del known[rid]
        step_id = self.num_steps
        self.num_steps += 1
        out = scheduler_output
        msg = (step_id, requests, new, forget, out.preempted_ids, out.admitted_ids, out.blocks_to_swap_out,
               out.blocks_to_swap_in, out.num_spec_tokens)
        return step_id, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


class StepDecoder:
    """Worker side: bytes -> (step id, ``SchedulerOutput``), with the placeholders of async scheduling filled.

    Raises (from ``decode``):
        RuntimeError: a placeholder for a request this worker sampled nothing for in the previous step (a bug).
    """

    def __init__(self):
        self._cache: dict[str, tuple[SamplingParams, Sequence[int]]] = {}
        self._last_sampled: dict[str, int] = {}  # request id -> the last token sampled for it in the last step

    def decode(self, data: bytes) -> tuple[int, SchedulerOutput]:
        (step_id, requests, new, forget, preempted, admitted, swap_out, swap_in, num_spec) = pickle.loads(data)
        cache = self._cache
        for rid in forget:
            del cache[rid]
        cache.update(new)
        scheduled = []
        for rid, token_ids, start, block_ids, sample, is_prefill, output_index, spec, outputs in requests:
            params, prompt = cache[rid]
            if token_ids[-1] == PLACEHOLDER_TOKEN_ID:  # a decode of the token the previous step sampled
                token_ids[-1] = self._sampled_before(rid)
            if outputs is not None and len(outputs) < output_index:
                outputs.append(self._sampled_before(rid))
            scheduled.append(ScheduledRequest(rid, token_ids, start, block_ids, sample, is_prefill, params,
                                              output_index, prompt, outputs if outputs is not None else (), spec))
        return step_id, SchedulerOutput(scheduled=scheduled, preempted_ids=preempted, admitted_ids=admitted,
                                        blocks_to_swap_out=swap_out, blocks_to_swap_in=swap_in,
                                        num_spec_tokens=num_spec)

    def record(self, sampled: dict[str, list[int]]) -> None:
        """Remember the tokens of the step just run (what the next step's placeholders stand for)."""
        self._last_sampled = {rid: tokens[-1] for rid, tokens in sampled.items()}

    def _sampled_before(self, request_id: str) -> int:
        token = self._last_sampled.get(request_id)
        if token is None:
            raise RuntimeError(f"request {request_id!r} has a placeholder token but sampled nothing in the "
                               f"previous step")
        return token


def tokens_digest(sampled: dict[str, list[int]]) -> int:
    """A number every rank computes from its sampled tokens (in the step's order); equal on all ranks when
    they sampled the same. ``hash`` of ints is not salted per process (strings are), so ranks agree."""
    return hash(tuple(map(tuple, sampled.values())))


@dataclass
class WorkerReply:
    """One worker's answer to one step.

    Attributes:
        step_id, rank: which step, which worker.
        sampled: rank 0 only: {request id: tokens} as ``ModelRunner.execute`` returns; None on other ranks.
        digest: ``tokens_digest`` of this rank's sampled tokens (the driver checks all ranks agree).
        logprobs, prompt_logprobs: rank 0 only: ``ModelRunner.last_logprobs`` / ``last_prompt_logprobs``.
        swap_time_s: seconds of KV block copies to / from the swap space (rank 0's).
        num_all_reduces, all_reduce_bytes, num_all_gathers, all_gather_bytes, num_all_to_alls,
            all_to_all_bytes: the collectives this rank ran in the step (``TensorParallelGroup``; all-to-all bytes
            are those this rank sent to the others).
        expert_loads: expert parallelism: per MoE layer run in the step, the (token, expert) pairs this rank
            routed to each expert (``TensorParallelGroup.expert_loads``); empty otherwise.
        execute_time_s: wall seconds from receiving the step to having its tokens (decode, inputs, forward,
            sampling), measured in the worker.
        started_at, finished_at: the same span in ``time.monotonic()`` seconds (one system-wide clock on Linux,
            so the driver can compare it with its own times: ``benchmarks/async_scheduling.py``).
    """

    step_id: int
    rank: int
    sampled: dict[str, list[int]] | None
    digest: int
    logprobs: dict = field(default_factory=dict)
    prompt_logprobs: dict = field(default_factory=dict)
    swap_time_s: float = 0.0
    num_all_reduces: int = 0
    all_reduce_bytes: int = 0
    num_all_gathers: int = 0
    all_gather_bytes: int = 0
    num_all_to_alls: int = 0
    all_to_all_bytes: int = 0
    expert_loads: list = field(default_factory=list)
    execute_time_s: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
