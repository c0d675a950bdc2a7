"""ForwardBatch: one step flattened into the tensors the model forward needs, built with numpy.

The index arithmetic follows vLLM V1's ``GPUModelRunner._prepare_inputs``: a loop over the B scheduled
requests reads their few numbers (start position, new tokens, sample?), and everything per token (positions,
slot mapping) is computed by numpy on whole arrays, from block tables kept between steps (``BlockTable``).
No Python loop runs over tokens or over blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch

from minengine.core.scheduler_output import SchedulerOutput
from minengine.worker.block_table import BlockTable

# Decodes are attended in groups of similar length, each padded to its longest member: a request joins the
# group of a longer one when it needs at least DECODE_GROUP_MIN_FILL of that one's blocks (so at most ~1/4
# of a group's gathered keys are padding), and a group gathers at most DECODE_GROUP_MAX_KEYS keys (so the
# gathered K/V of one group stays in the CPU caches while it is attended).
DECODE_GROUP_MIN_FILL = 0.75
DECODE_GROUP_MAX_KEYS = 16384


@dataclass
class DecodeGroup:
    """Requests with one new token (decodes) attended together, their keys padded to one length.

    Attributes:
        first_row, num_requests: the group's query rows are ``first_row .. first_row + num_requests`` (the
            batch is ordered so that every group is a slice).
        block_ids: [n * num_blocks] int64, the blocks to gather, request after request; entries past a
            request's own blocks are any valid block id (masked out).
        num_blocks: blocks per request after padding; keys = num_blocks * block_size.
        key_mask: [n, 1, 1, keys] bool, True for a request's own keys (positions < its seq_len).
    """

    first_row: int
    num_requests: int
    block_ids: torch.Tensor
    num_blocks: int
    key_mask: torch.Tensor


@dataclass
class PrefillGroup:
    """Requests with more than one new token and the same (q_len, seq_len), attended in one call.

    Attributes:
        first_row, num_requests, q_len: the group's query rows are ``first_row .. first_row + n * q_len``,
            request after request.
        seq_len: tokens of each request after the step; its new tokens sit at positions
            ``seq_len - q_len .. seq_len - 1``.
        block_ids: [n * cdiv(seq_len, block_size)] int64, the blocks holding the keys, request after request.
            For a prefill from position 0 (q_len == seq_len, ``from_start``) they hold exactly this step's own
            K/V rows, which the torch path then takes from the step's tensors instead of gathering.
        mask: [q_len, seq_len] bool (True = visible) for chunks after cached context, None for the plain
            causal triangle.
    """

    first_row: int
    num_requests: int
    q_len: int
    seq_len: int
    block_ids: torch.Tensor
    mask: torch.Tensor | None

    @property
    def from_start(self) -> bool:
        """A prefill from position 0: its keys are its own new tokens."""
        return self.q_len == self.seq_len


@dataclass
class ForwardBatch:
    """A step's tokens, flattened over requests (no padding), with the attention metadata.

    T = total new tokens of the step, B = scheduled requests, S = requests that sample this step. The B
    requests are laid out in *batch order*, not the scheduler's: decodes first, longest first, then prefill
    chunks grouped by shape, so that every attention group is a contiguous slice of rows (vLLM reorders its
    persistent batch the same way for its decode kernels). Every per-token op is order-free;
    ``logits_indices`` maps back to the scheduler's order.

    Attributes:
        input_ids: [T] int64, the new tokens, request after request (batch order).
        positions: [T] int64, each token's position in its own request.
        slot_mapping: [T] int64, ``block_id * block_size + position % block_size``: where its K/V is written.
        query_start_loc: [B + 1] int32, prefix sums of the new tokens per request (batch order).
        seq_lens: [B] int32, tokens with K/V in the cache after this step (context + new), batch order.
        logits_indices: [R] int64, the rows whose logits are sampled, sampling request after sampling request
            in the scheduler's order: the row of each one's last new token (R = S), and for a decode verifying
            k proposals its last k + 1 rows (``ScheduledRequest.num_sampled``); only these rows go through the
            LM head, so intermediate prefill chunks cost no logits.
        batch_order: [B] int64 numpy, the scheduler index of each request in batch order.
        first_rows: [B] int64 numpy, per request in the scheduler's order, the row of its first new token.
        block_size: tokens per KV block.
        block_tables: [B, max_blocks] int32 physical block ids per request in batch order (entries past a
            request's blocks are never read), for the Triton kernel; None when built for a CPU backend.
        decode_groups, prefill_groups: the CPU backends' plan (``layers/attention.py``), computed once
            per step and shared by every layer.
        num_decodes: requests with exactly one new token (the first ``num_decodes`` in batch order).
        attention_backend: the ``paged_attention`` backend that reads this batch ("reference", "cpu",
            "triton"; ``layers/attention.py``).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    logits_indices: torch.Tensor
    batch_order: np.ndarray
    first_rows: np.ndarray
    block_size: int
    block_tables: torch.Tensor | None = None
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefill_groups: list[PrefillGroup] = field(default_factory=list)
    num_decodes: int = 0
    attention_backend: str = "cpu"

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def build(cls, scheduler_output: SchedulerOutput, block_size: int, device: torch.device | str = "cpu",
              block_table: BlockTable | None = None, attention_backend: str = "cpu") -> ForwardBatch:
        """Flatten a (non-empty) step.

        Args:
            scheduler_output: the step.
            block_size: tokens per KV block.
            device: where the tensors go.
            block_table: the runner's persistent ``BlockTable`` (updated here); None builds a throwaway one.
            attention_backend: the backend ``paged_attention`` runs (the ``ModelRunner``'s): "triton" builds
                ``block_tables`` for the Triton kernel, "reference" and "cpu" (the C++ kernel where it is ready,
                the reference otherwise) the decode and prefill groups instead.

        Raises:
            ValueError: an empty step (the runner skips those).
        """
        scheduled = scheduler_output.scheduled
        if not scheduled:
            raise ValueError("ForwardBatch.build needs a step with at least one scheduled request")
        if block_table is None:
            block_table = BlockTable()
        rows = block_table.update(scheduler_output, block_size)
        num_reqs = len(scheduled)
        q_lens = np.fromiter((len(s.token_ids) for s in scheduled), np.int64, num_reqs)
        starts = np.fromiter((s.start_pos for s in scheduled), np.int64, num_reqs)
        blocks_needed = -(-(starts + q_lens) // block_size)
        order, num_decodes = _batch_order(q_lens, starts, blocks_needed)
        q_lens, starts, rows, blocks_needed = q_lens[order], starts[order], rows[order], blocks_needed[order]
        seq_lens = starts + q_lens

        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(q_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        input_ids = np.fromiter(chain.from_iterable(scheduled[i].token_ids for i in order.tolist()), np.int64,
                                num_tokens)
        table = block_table.table
        positions, slot_mapping = _positions_and_slots(q_lens, starts, query_start_loc, table[rows], block_size)
        where = np.empty(num_reqs, dtype=np.int64)  # scheduler index -> batch row
        where[order] = np.arange(num_reqs)

        def t(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)

        batch = cls(input_ids=t(input_ids, torch.long), positions=t(positions, torch.long),
                    slot_mapping=t(slot_mapping, torch.long), query_start_loc=t(query_start_loc, torch.int32),
                    seq_lens=t(seq_lens, torch.int32),
                    logits_indices=t(_logits_indices(scheduler_output, where, query_start_loc), torch.long),
                    batch_order=order, first_rows=query_start_loc[where], block_size=block_size,
                    num_decodes=num_decodes, attention_backend=attention_backend)
        batch._plan_attention(table[rows, :int(blocks_needed.max())], q_lens, seq_lens, query_start_loc,
                              blocks_needed, t)
        return batch

    def _plan_attention(self, tables, q_lens, seq_lens, query_start_loc, blocks_needed, t) -> None:
        """The Triton kernel's ``block_tables``, or the CPU backends' decode and prefill groups."""
        if self.attention_backend == "triton":
            self.block_tables = t(tables, torch.int32)
            return
        self.decode_groups = _decode_groups(self.num_decodes, seq_lens, tables, blocks_needed, self.block_size, t)
        self.prefill_groups = _prefill_groups(self.num_decodes, q_lens, seq_lens, query_start_loc, tables,
                                              blocks_needed, t)


def _positions_and_slots(q_lens: np.ndarray, starts: np.ndarray, query_start_loc: np.ndarray, tables: np.ndarray,
                         block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token (batch order): its position in its request, and its slot ``block_id * block_size + offset``
    through its request's block table (``tables``: one row per request)."""
    num_tokens = int(query_start_loc[-1])
    # Per token: its request, then its position = the request's start + its offset in the request's chunk.
    req_of_token = np.repeat(np.arange(len(q_lens)), q_lens)
    positions = np.arange(num_tokens) + np.repeat(starts - query_start_loc[:-1], q_lens)
    slot_mapping = tables[req_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return positions, slot_mapping


def _batch_order(q_lens: np.ndarray, starts: np.ndarray, blocks_needed: np.ndarray) -> tuple[np.ndarray, int]:
    """Batch order (scheduler indices) and the number of decodes: decodes by blocks needed (descending), then
    prefill chunks grouped by (q_len, seq_len), so that every attention group is a slice of rows."""
    decodes = np.flatnonzero(q_lens == 1)
    decodes = decodes[np.argsort(-blocks_needed[decodes], kind="stable")]
    prefills = np.flatnonzero(q_lens > 1)
    prefills = prefills[np.lexsort((starts[prefills] + q_lens[prefills], q_lens[prefills]))]
    return np.concatenate([decodes, prefills]), len(decodes)


def _logits_indices(scheduler_output: SchedulerOutput, where: np.ndarray, query_start_loc: np.ndarray) -> np.ndarray:
    """The rows sampled, sampling request after sampling request in the scheduler's order: each one's last row,
    and a speculative decode's last 1 + k rows."""
    scheduled = scheduler_output.scheduled
    sample = np.fromiter((s.sample for s in scheduled), np.bool_, len(scheduled))
    logits_indices = query_start_loc[where[np.flatnonzero(sample)] + 1] - 1
    if scheduler_output.num_spec_tokens:
        num_sampled = np.fromiter((s.num_sampled for s in scheduled if s.sample), np.int64, len(logits_indices))
        first = logits_indices - num_sampled + 1
        logits_indices = (np.repeat(first - np.cumsum(num_sampled) + num_sampled, num_sampled)
                          + np.arange(int(num_sampled.sum())))
    return logits_indices


def plan_decode_groups(num_blocks_desc: np.ndarray, block_size: int, min_fill: float = DECODE_GROUP_MIN_FILL,
                       max_keys: int = DECODE_GROUP_MAX_KEYS) -> list[tuple[int, int]]:
    """Cut requests sorted by blocks needed (descending) into [start, end) groups.

    A group starts at its longest request and takes the following ones while they need at least
    ``min_fill`` of its blocks and the group's padded keys stay within ``max_keys`` (at least one request
    per group). O(groups) numpy searches, not a loop over requests.
    """
    groups, start, n = [], 0, len(num_blocks_desc)
    ascending = num_blocks_desc[::-1]
    while start < n:
        longest = int(num_blocks_desc[start])
        # Requests needing >= min_fill * longest blocks: a prefix of the descending order.
        fits = n - int(np.searchsorted(ascending, min_fill * longest, side="left"))
        cap = max(1, max_keys // (longest * block_size))
        end = max(min(fits, start + cap), start + 1)
        groups.append((start, end))
        start = end
    return groups


def _decode_groups(num_decodes, seq_lens, tables, blocks_needed, block_size, t):
    if num_decodes == 0:
        return []
    # One conversion for all decodes; each group is then a slice (the mask a strided view, no copy).
    width = int(blocks_needed[0])  # the longest decode comes first
    block_ids = t(tables[:num_decodes, :width], torch.long)
    key_mask = t(np.arange(width * block_size)[None, :] < seq_lens[:num_decodes, None], torch.bool)
    groups = []
    for start, end in plan_decode_groups(blocks_needed[:num_decodes], block_size):
        w = int(blocks_needed[start])
        groups.append(DecodeGroup(first_row=start, num_requests=end - start,
                                  block_ids=block_ids[start:end, :w].reshape(-1), num_blocks=w,
                                  key_mask=key_mask[start:end, None, None, :w * block_size].contiguous()))
    return groups


def _prefill_groups(num_decodes, q_lens, seq_lens, query_start_loc, tables, blocks_needed, t):
    groups = []
    i, num_reqs = num_decodes, len(q_lens)
    while i < num_reqs:  # requests of one shape are adjacent in batch order
        q_len, seq_len = int(q_lens[i]), int(seq_lens[i])
        end = i + 1
        while end < num_reqs and q_lens[end] == q_len and seq_lens[end] == seq_len:
            end += 1
        block_ids = t(tables[i:end, :int(blocks_needed[i])].reshape(-1), torch.long)
        mask = None
        if q_len != seq_len:
            # Query j sits at position seq_len - q_len + j and sees keys 0..that position.
            mask = t(np.arange(seq_len)[None, :] <= np.arange(seq_len - q_len, seq_len)[:, None], torch.bool)
        groups.append(PrefillGroup(first_row=int(query_start_loc[i]), num_requests=end - i, q_len=q_len,
                                   seq_len=seq_len, block_ids=block_ids, mask=mask))
        i = end
    return groups
