"""FleetRequest: one trace request on its way through the fleet (a leaf module: the routers, the replicas and the
simulator all read it, and it imports nothing of ``minengine.fleet``).

A trace without text gets ``synthetic_prompt_ids``: consecutive ids from a start that differs per request, so no two
such prompts share a KV block by accident. Hashes are the engine's own (``minengine.core.kv_cache_manager
.hash_block``, chained over full blocks), so a replica's prefix cache, the fleet's KV store and the infinite-cache
ideal all key a block the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minengine.core.kv_cache_manager import hash_block

if TYPE_CHECKING:
    from minengine.outputs import RequestMetrics

_SPREAD = 7919  # a prime coprime to every vocabulary size below: spreads synthetic prompts over the vocabulary


def synthetic_prompt_ids(index: int, length: int, vocab_size: int, seed: int = 0) -> list[int]:
    """Token ids for the ``index``-th request of a trace without text: ``length`` consecutive ids (mod the
    vocabulary) from a start that differs for every ``index`` below ``vocab_size`` (and every seed), so no two
    such prompts share their first KV block and there is no accidental prefix sharing. Cheap (C-speed ranges):
    a fleet run synthesizes millions of tokens."""
    start = ((index + 1_000_003 * seed) * _SPREAD) % vocab_size
    ids = list(range(start, min(vocab_size, start + length)))
    while len(ids) < length:  # wrap around the vocabulary
        ids += range(0, min(vocab_size, length - len(ids)))
    return ids


def fit_to_limit(prompt_len: int, output_len: int, limit: int) -> tuple[int, int]:
    """Cut a (prompt, output) pair of token counts to ``limit`` tokens in all: the prompt first (its start, where
    prefixes are shared, stays), at least 1 prompt and 1 output token (what ``minengine.workloads.replay`` does with
    ``too_long="clip"``). Unchanged when it fits."""
    if prompt_len + output_len <= limit:
        return prompt_len, output_len
    prompt = max(1, min(prompt_len, limit - output_len))
    return prompt, max(1, min(output_len, limit - prompt))


def prompt_block_hashes(token_ids: list[int], block_size: int) -> list[bytes]:
    """Chained hashes of the full ``block_size``-token blocks of ``token_ids`` (the engine's ``hash_block``):
    ``len(token_ids) // block_size`` of them; hash i stands for tokens [0, (i + 1) x block_size)."""
    hashes: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        hashes.append(hash_block(hashes[-1] if hashes else None, token_ids[i * block_size:(i + 1) * block_size]))
    return hashes


@dataclass
class FleetRequest:
    """One trace request on its way through the fleet.

    Attributes:
        index: its position in arrival order; ``request_id``, ``arrival_time`` (s), ``prompt_len``, ``output_len``
            (tokens, after clipping) as in the trace.
        replica: the first-stage replica (mixed or prefill) it was routed to; ``decode_replica`` (disaggregated).
        first_token: what the prefill replica sampled; ``prefill_metrics``: its ``RequestMetrics`` there.
        transfer_start, transfer_end: when its KV left and reached the decode replica (s; disaggregated).
        load_blocks: (first, end) block indices of the prefix it loads from the fleet's KV store, or None.
    """

    index: int
    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    token_ids: list[int] | None
    vocab_size: int
    block_size: int
    seed: int = 0
    replica: int = -1
    decode_replica: int = -1
    first_token: int | None = None
    prefill_metrics: RequestMetrics | None = None
    transfer_start: float | None = None
    transfer_end: float | None = None
    load_blocks: tuple[int, int] | None = None
    _hashes: list[bytes] | None = field(default=None, repr=False)

    def prompt_ids(self) -> list[int]:
        """The prompt's token ids: the trace's, or ``synthetic_prompt_ids`` (made when first needed)."""
        if self.token_ids is None:
            self.token_ids = synthetic_prompt_ids(self.index, self.prompt_len, self.vocab_size, self.seed)
        return self.token_ids

    def block_hashes(self) -> list[bytes]:
        """Chained hashes of the prompt's full KV blocks (``prompt_block_hashes``), computed once."""
        if self._hashes is None:
            self._hashes = prompt_block_hashes(self.prompt_ids(), self.block_size)
        return self._hashes

    @property
    def max_hit_blocks(self) -> int:
        """The most leading blocks a prefix hit may cover: ``(prompt_len - 1) // block_size`` (the engine always
        recomputes the last prompt token, to have logits to sample from)."""
        return (self.prompt_len - 1) // self.block_size

    def release(self) -> None:
        """Forget the token ids and hashes once the request has left the fleet (memory)."""
        self.token_ids = None
        self._hashes = None
