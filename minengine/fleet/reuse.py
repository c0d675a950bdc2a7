"""The infinite-cache ideal of a trace: how many prompt tokens any prefix cache could serve at most.

Walk the requests in arrival order; a request's prompt hits its first ``k`` full blocks when each of them (with the
engine's chained hashes, so also every block before it) was a full block of an earlier request's prompt; then all its
full blocks are remembered forever. As in the engine, at most ``(prompt_len - 1) // block_size`` blocks can hit (the
last prompt token is always computed). This is the share the shared/data README quotes for the Mooncake trace at
512-token granularity ("a block counts as a hit only if it and all blocks before it in that request were seen
earlier"), here at the engine's block size and with its cap, so a fleet's ``prefix_hit_rate`` compares with it
directly. Requests without token ids get synthetic ids that share no block (``synthetic_prompt_ids``): they hit 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minengine.fleet.request import fit_to_limit, prompt_block_hashes
from minengine.workloads.traces import TraceRequest


@dataclass(frozen=True)
class ReuseStats:
    """A trace's infinite-cache ideal (tokens).

    Attributes:
        num_requests, prompt_tokens: the requests and their prompt tokens (after clipping to ``max_model_len``).
        hit_tokens: prompt tokens an infinite shared prefix cache serves; ``num_requests_hit``: requests with a hit.
        distinct_blocks: distinct full prompt blocks in the trace (what an infinite cache would hold).
    """

    num_requests: int
    prompt_tokens: int
    hit_tokens: int
    num_requests_hit: int
    distinct_blocks: int

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0 for an empty trace)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def infinite_cache_hits(trace: Sequence[TraceRequest], block_size: int = 16,
                        max_model_len: int | None = None) -> ReuseStats:
    """The infinite-cache ideal of ``trace`` (see the module docstring) for KV blocks of ``block_size`` tokens,
    prompts clipped as the fleet clips them to ``max_model_len`` (prompt + output) when given.

    Raises:
        ValueError: ``block_size`` not a positive integer.
    """
    seen: set[bytes] = set()
    prompt = hit = num_hit = 0
    for _, plen, k, _ in _walk(trace, block_size, max_model_len, seen):
        prompt += plen
        hit += k * block_size
        num_hit += k > 0
    return ReuseStats(len(trace), prompt, hit, num_hit, len(seen))


def reusable_prefix_tokens(trace: Sequence[TraceRequest], block_size: int = 16,
                           max_model_len: int | None = None) -> dict[str, int]:
    """Each request's share of the infinite-cache ideal: ``{request_id: leading prompt tokens an infinite shared
    prefix cache serves it}`` (0: no earlier prompt shares its first block; the values sum to
    ``infinite_cache_hits(...).hit_tokens``). Tells which requests no cache, however large, can speed up.

    Raises:
        ValueError: ``block_size`` not a positive integer.
    """
    return {r.request_id: k * block_size for r, _, k, _ in _walk(trace, block_size, max_model_len, set())}


def reuse_gaps(trace: Sequence[TraceRequest], block_size: int = 16,
               max_model_len: int | None = None) -> dict[str, float | None]:
    """How long each request's reusable prefix had gone unused: ``{request_id: seconds from the arrival of the
    latest earlier request whose prompt held that whole prefix to this one's arrival}`` (None: nothing reusable).
    A cache that evicts least recently used blocks serves the prefix only if it keeps blocks at least that long.

    Raises:
        ValueError: ``block_size`` not a positive integer.
    """
    last: dict[bytes, float] = {}
    out: dict[str, float | None] = {}
    for r, _, k, hashes in _walk(trace, block_size, max_model_len, set()):
        # chained hashes: the prefix's last block stands for the whole prefix
        out[r.request_id] = r.arrival_time - last[hashes[k - 1]] if k else None
        for h in hashes:
            last[h] = r.arrival_time
    return out


def _walk(trace: Sequence[TraceRequest], block_size: int, max_model_len: int | None, seen: set[bytes]):
    """(request, clipped prompt length, leading blocks hit, its full blocks' hashes) in arrival order, remembering
    every full block in ``seen``."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    for r in sorted(trace, key=lambda r: r.arrival_time):  # stable: ties keep trace order, as the simulator
        plen = r.prompt_len
        if max_model_len is not None:
            plen, _ = fit_to_limit(plen, r.output_len, max_model_len)
        if r.prompt_token_ids is None:
            yield r, plen, 0, []
            continue
        hashes = prompt_block_hashes(r.prompt_token_ids[:plen], block_size)
        k, cap = 0, (plen - 1) // block_size
        while k < min(cap, len(hashes)) and hashes[k] in seen:
            k += 1
        seen.update(hashes)
        yield r, plen, k, hashes
