"""ForwardBatch: one step flattened into the tensors the model forward needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minengine.core.scheduler_output import SchedulerOutput


@dataclass
class ForwardBatch:
    """A step's tokens, flattened over requests (no padding), with the attention metadata.

    T = total new tokens of the step, B = scheduled requests, S = requests that sample this step.

    Attributes:
        input_ids: [T] int64, the new tokens, request after request.
        positions: [T] int64, each token's position in its own request.
        slot_mapping: [T] int64, ``block_id * block_size + position % block_size``: where its K/V is written.
        block_tables: [B, max_blocks] int32, physical block ids per request, padded with 0 (never read).
        query_start_loc: [B + 1] int32, prefix sums of the new tokens per request.
        seq_lens: [B] int32, tokens with K/V in the cache after this step (context + new).
        logits_indices: [S] int64, rows of the last new token of each sampling request; only these rows go
            through the LM head, so intermediate prefill chunks cost no logits.
        block_tables_list, query_start_loc_list, seq_lens_list: the same as Python lists, for the CPU
            reference attention (no device sync).
        single_query_rows: [N1] int64, rows of requests with exactly one new token (decodes, 1-token chunks).
            Their attention is one batched call: a single query sees every cached key of its own request.
        single_query_slots: [N1, L] int64, cache slots of keys 0..L-1 of each such request (L = its longest
            seq_len); single_query_mask: [N1, L] bool, True for a request's own keys, False for padding.
        multi_query_requests: indices (into the B requests) of those with more than one new token (prefill
            chunks), attended one request at a time.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    logits_indices: torch.Tensor
    block_tables_list: list[list[int]]
    query_start_loc_list: list[int]
    seq_lens_list: list[int]
    single_query_rows: torch.Tensor
    single_query_slots: torch.Tensor
    single_query_mask: torch.Tensor
    multi_query_requests: list[int]

    @classmethod
    def build(cls, scheduler_output: SchedulerOutput, block_size: int, device: torch.device) -> ForwardBatch:
        input_ids, positions, slots = [], [], []
        block_tables, starts, seq_lens, logits_indices = [], [0], [], []
        for s in scheduler_output.scheduled:
            input_ids.extend(s.token_ids)
            pos = range(s.start_pos, s.seq_len)
            positions.extend(pos)
            slots.extend(s.block_ids[p // block_size] * block_size + p % block_size for p in pos)
            block_tables.append(s.block_ids)
            starts.append(starts[-1] + s.num_new_tokens)
            seq_lens.append(s.seq_len)
            if s.sample:
                logits_indices.append(starts[-1] - 1)
        width = max(len(b) for b in block_tables)
        padded = [b + [0] * (width - len(b)) for b in block_tables]

        def t(x, dtype):
            return torch.tensor(x, dtype=dtype, device=device)

        single = [i for i, s in enumerate(scheduler_output.scheduled) if s.num_new_tokens == 1]
        multi = [i for i, s in enumerate(scheduler_output.scheduled) if s.num_new_tokens > 1]
        single_slots, single_mask = cls._single_query_slots(
            [block_tables[i] for i in single], [seq_lens[i] for i in single], block_size, device)
        return cls(
            input_ids=t(input_ids, torch.long), positions=t(positions, torch.long), slot_mapping=t(slots, torch.long),
            block_tables=t(padded, torch.int32), query_start_loc=t(starts, torch.int32),
            seq_lens=t(seq_lens, torch.int32), logits_indices=t(logits_indices, torch.long),
            block_tables_list=block_tables, query_start_loc_list=starts, seq_lens_list=seq_lens,
            single_query_rows=t([starts[i] for i in single], torch.long), single_query_slots=single_slots,
            single_query_mask=single_mask, multi_query_requests=multi,
        )

    @staticmethod
    def _single_query_slots(block_tables: list[list[int]], seq_lens: list[int], block_size: int,
                            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots of every key position 0..L-1 of each request ([N, L] int64) and the mask of real keys."""
        if not block_tables:
            return (torch.zeros((0, 0), dtype=torch.long, device=device),
                    torch.zeros((0, 0), dtype=torch.bool, device=device))
        max_len = max(seq_lens)
        width = -(-max_len // block_size)
        tables = torch.tensor([b[:width] + [0] * (width - len(b[:width])) for b in block_tables], dtype=torch.long,
                              device=device)
        pos = torch.arange(max_len, device=device)
        slots = tables[:, pos // block_size] * block_size + pos % block_size
        mask = pos[None, :] < torch.tensor(seq_lens, device=device)[:, None]
        return slots, mask
